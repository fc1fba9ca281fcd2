package cli

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"lock.dev/lockd/client"
	"lock.dev/lockd/store"
)

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

// heldBy describes a key's holder for status lines and errors: "held by
// web-3 (pid 812, deploy/api) token 42 for 3m", or "held by token 42 for 3m"
// when the holder gave no owner. The owner is shown like a key (displayKey).
func heldBy(info client.LockInfo, now time.Time) string {
	who := ""
	if info.Owner != "" {
		who = displayKey(info.Owner) + " "
	}
	return fmt.Sprintf("held by %stoken %d for %s", who, info.Token, formatHeld(heldFor(info, now)))
}

// displayLabels shows labels as k=v pairs in key order, each part quoted
// like a key when it is not plain printable text.
func displayLabels(labels map[string]string) string {
	keys := slices.Sorted(maps.Keys(labels))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = displayKey(k) + "=" + displayKey(labels[k])
	}
	return strings.Join(parts, " ")
}

// displayValue shows a grant's value: as text when it is printable UTF-8,
// else Go-quoted (binary values stay on one line and escape nothing).
func displayValue(v []byte) string {
	return displayKey(string(v))
}

// defaultOwner is the owner lockd run gives its session without --owner:
// "host (pid N, cmd)", made printable and cut to store.MaxOwnerBytes.
func defaultOwner(argv []string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	cmd := ""
	if len(argv) > 0 {
		cmd = filepath.Base(argv[0])
	}
	return sanitizeOwner(fmt.Sprintf("%s (pid %d, %s)", host, os.Getpid(), cmd))
}

// sanitizeOwner replaces what store.ValidateOwner refuses (control and
// other unprintable characters) and cuts s to store.MaxOwnerBytes on a
// character boundary.
func sanitizeOwner(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	for len(s) > store.MaxOwnerBytes {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}
