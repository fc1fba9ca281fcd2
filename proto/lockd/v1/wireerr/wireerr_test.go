package wireerr_test

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// TestReasons checks the vocabulary: every reason, the HTTP listener's
// included, is distinct and has a code.
func TestReasons(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range append(wireerr.Reasons(), wireerr.HTTPReasons()...) {
		if seen[r] {
			t.Errorf("reason %s listed twice", r)
		}
		seen[r] = true
		if c := wireerr.Code(r); c == codes.Unknown || c == codes.OK {
			t.Errorf("Code(%s) = %v; want a lockd code", r, c)
		}
	}
	if c := wireerr.Code("NO_SUCH_REASON"); c != codes.Unknown {
		t.Errorf("Code(NO_SUCH_REASON) = %v; want Unknown", c)
	}
}

// TestStatusRoundTrip encodes every reason, with and without a field
// violation, and decodes it from the error a gRPC handler would return.
func TestStatusRoundTrip(t *testing.T) {
	for _, r := range append(wireerr.Reasons(), wireerr.HTTPReasons()...) {
		err := wireerr.Status(r, "msg", nil).Err()
		st := status.Convert(err)
		if st.Code() != wireerr.Code(r) || wireerr.Reason(st) != r || st.Message() != "msg" {
			t.Errorf("Status(%s): code %v, reason %q, message %q; want %v, %s, msg", r, st.Code(), wireerr.Reason(st), st.Message(), wireerr.Code(r), r)
		}
		if v, ok := wireerr.FieldViolation(st); ok {
			t.Errorf("Status(%s) without a violation has one: %+v", r, v)
		}
	}
	v := wireerr.Violation{Field: "key", Description: "key is empty"}
	st := status.Convert(wireerr.Status(wireerr.ReasonInvalidArgument, v.Message(), &v).Err())
	got, ok := wireerr.FieldViolation(st)
	if !ok || got != v || st.Message() != "key: key is empty" {
		t.Errorf("invalid key: violation %+v (%v), message %q; want %+v, %q", got, ok, st.Message(), v, "key: key is empty")
	}
	// Errors from elsewhere carry no lockd reason.
	for _, err := range []error{errors.New("plain"), status.Error(codes.Unavailable, "transport")} {
		if r := wireerr.Reason(status.Convert(err)); r != "" {
			t.Errorf("Reason(%v) = %q; want none", err, r)
		}
	}
}

func TestLimitStatus(t *testing.T) {
	for _, limit := range wireerr.Limits() {
		st := wireerr.LimitStatus(limit, "too many")
		if st.Code() != codes.ResourceExhausted || wireerr.Reason(st) != wireerr.ReasonLimit || wireerr.Limit(st) != limit {
			t.Errorf("LimitStatus(%q) = code %v reason %q limit %q; want ResourceExhausted, LIMIT, %q",
				limit, st.Code(), wireerr.Reason(st), wireerr.Limit(st), limit)
		}
	}
	if got := wireerr.Limit(wireerr.Status(wireerr.ReasonLimit, "x", nil)); got != "" {
		t.Errorf("Limit of a LIMIT status without metadata = %q, want empty", got)
	}
	if got := wireerr.Limit(wireerr.Status(wireerr.ReasonNotOwner, "x", nil)); got != "" {
		t.Errorf("Limit of a NOT_OWNER status = %q, want empty", got)
	}
}
