package store

// KeepPlace makes the session's place in the key's queue outlive the call
// (C2 #ct2-keep-place): when Acquire ends without a grant for any reason but
// the session's end (ctx ended, a transient backend error), the entry stays
// where it is; the next Acquire of the same session and key, through any
// instance, resumes it. It is left by LeaveQueue, or when the session ends.
func KeepPlace() AcquireOption { return func(o *AcquireOptions) { o.KeepPlace = true } }

// KeepsPlace reports whether opts include KeepPlace, whatever else they
// set (the other options are checked by NewAcquireOptions).
func KeepsPlace(opts []AcquireOption) bool {
	var o AcquireOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o.KeepPlace
}
