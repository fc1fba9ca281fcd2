package cli

import "strconv"

// displayKey is how text output shows a key: as it is when every character
// is printable (jobs/nightly), otherwise Go-quoted ("a\x1b[2J\r\nb"). Keys
// are any UTF-8 without NUL (store.ValidateKey), so a raw key could carry
// ESC sequences, CR/LF or bidi overrides that forge lines on an operator's
// terminal; quoting makes every such character visible and keeps each
// record on one line. JSON output needs no such care: encoding/json escapes
// control characters, and bidi overrides are shown by JSON viewers as
// data.
func displayKey(key string) string {
	if q := strconv.Quote(key); q[1:len(q)-1] != key {
		return q
	}
	return key
}
