package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// httpError writes an error answer: the HTTP status of the gRPC code and
// the google.rpc.Status JSON plus "reason", the lockd ErrorInfo reason
// (C2 #ct2-http). An error the gateway made itself (a request it could not
// decode) or the in-process hop's transport made gets its reason here
// (C2 #ct2-http-refusals).
func httpError(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, _ *http.Request, err error) {
	httpStatus := 0
	if hse, ok := errors.AsType[*runtime.HTTPStatusError](err); ok {
		httpStatus, err = hse.HTTPStatus, hse.Err
	}
	st := status.Convert(err)
	if st.Code() == codes.InvalidArgument && wireerr.Reason(st) == "" && strings.Contains(st.Message(), "http: request body too large") {
		// The gateway's decoding hit limitBody's bound (C2 #ct2-bad-input).
		writeError(w, http.StatusRequestEntityTooLarge, status.Convert(badInputStatus(
			invalidf("request", "the body is over the %d KiB bound (C2 #ct2-bad-input)", maxHTTPBody>>10))))
		return
	}
	st = withReason(st, httpStatus)
	if httpStatus == 0 {
		httpStatus = runtime.HTTPStatusFromCode(st.Code())
	}
	writeError(w, httpStatus, st)
}

// withReason gives a status without a lockd reason one by its code: the
// gateway's decoding errors are INVALID_ARGUMENT naming the field path
// (gatewayField), the in-process hop's failures INTERNAL or UNAVAILABLE. A
// caller's cancellation keeps none (nobody reads it).
func withReason(st *status.Status, httpStatus int) *status.Status {
	if wireerr.Reason(st) != "" {
		return st
	}
	switch st.Code() {
	case codes.InvalidArgument:
		field := gatewayField(st.Message())
		if httpStatus == http.StatusBadRequest && field == "request" {
			field = "path" // the mux's MalformedSequenceError: a path it cannot unescape
		}
		return wireerr.Status(wireerr.ReasonInvalidArgument, field+": "+st.Message(),
			&wireerr.Violation{Field: field, Description: st.Message()})
	case codes.Unavailable:
		return wireerr.Status(wireerr.ReasonUnavailable, st.Message(), nil)
	case codes.Canceled:
		return st
	}
	return wireerr.Status(wireerr.ReasonInternal, st.Message(), nil)
}

// gatewayFieldRE finds the field a grpc-gateway or protojson decoding error
// names: `missing parameter key`, `type mismatch, parameter: key`,
// `parsing field "ttl_ms"`, `unknown field "x"`, `invalid value for int64
// field ttl_ms`.
var gatewayFieldRE = regexp.MustCompile(`(?:parameter:? |field:? )"?([A-Za-z_][A-Za-z0-9_.]*)"?`)

// gatewayField is the request field a gateway decoding error names, by its
// proto name (protojson names a field by its JSON name, ttlMs), or
// "request" when it names none (a body that is not JSON).
func gatewayField(msg string) string {
	m := gatewayFieldRE.FindStringSubmatch(msg)
	if m == nil {
		return "request"
	}
	var b strings.Builder
	for _, r := range m[1] {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('_')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// routingError answers a request no route takes: 404 NO_ROUTE for an
// unknown path, 405 METHOD_NOT_ALLOWED for a known path with another
// method, 400 INVALID_ARGUMENT (field "path") for a request target that is
// not a path (C2 #ct2-http-refusals).
func routingError(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, _ *http.Request, httpStatus int) {
	writeError(w, httpStatus, refusalStatus(httpStatus))
}

// refusalStatus is the status of a routing refusal with HTTP status
// httpStatus (404, 405, 400; anything else is INTERNAL).
func refusalStatus(httpStatus int) *status.Status {
	switch httpStatus {
	case http.StatusNotFound:
		return wireerr.Status(wireerr.ReasonNoRoute, "no route has this path", nil)
	case http.StatusMethodNotAllowed:
		return wireerr.Status(wireerr.ReasonMethodNotAllowed, "this path has no route for this method", nil)
	case http.StatusBadRequest:
		v := wireerr.Violation{Field: "path", Description: "the request target is not a path"}
		return wireerr.Status(wireerr.ReasonInvalidArgument, v.Message(), &v)
	}
	return wireerr.Status(wireerr.ReasonInternal, http.StatusText(httpStatus), nil)
}

// consoleRefusal is the web console's refusal (internal/console): the same
// JSON shape and reasons as the API's.
func consoleRefusal(w http.ResponseWriter, httpStatus int) {
	writeError(w, httpStatus, refusalStatus(httpStatus))
}

func writeError(w http.ResponseWriter, httpStatus int, st *status.Status) {
	body, merr := errorBody(st)
	if merr != nil {
		body = []byte(`{"code":13,"message":"failed to encode the error","reason":"INTERNAL","details":[]}`)
	}
	w.Header().Del("Trailer")
	w.Header().Del("Transfer-Encoding")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	_, _ = w.Write(body)
}

// errorBody is the JSON of st with its lockd reason.
func errorBody(st *status.Status) ([]byte, error) {
	raw, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(st.Proto())
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	reason, err := json.Marshal(wireerr.Reason(st))
	if err != nil {
		return nil, err
	}
	fields["reason"] = reason
	return json.Marshal(fields)
}
