package store

// AcquireOption configures one Acquire (C2 #ct2-keep-place).
type AcquireOption func(*AcquireOptions)

// AcquireOptions are what Acquire's options set. Backends read them with
// NewAcquireOptions.
type AcquireOptions struct {
	// KeepPlace: an Acquire that ends without a grant for any reason but
	// the session's end leaves the session's queue entry in place (KeepPlace).
	KeepPlace bool
}

// KeepPlace makes the session's place in the key's queue outlive the call
// (C2 #ct2-keep-place): when Acquire ends without a grant for any reason but
// the session's end (ctx ended, a transient backend error), the entry stays
// where it is; the next Acquire of the same session and key, through any
// instance, resumes it. It is left by LeaveQueue, or when the session ends.
func KeepPlace() AcquireOption { return func(o *AcquireOptions) { o.KeepPlace = true } }

// NewAcquireOptions applies opts.
func NewAcquireOptions(opts []AcquireOption) AcquireOptions {
	var o AcquireOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}
