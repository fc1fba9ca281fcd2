package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// httpError writes an error answer: the HTTP status of the gRPC code and
// the google.rpc.Status JSON plus "reason", the lockd ErrorInfo reason
// (C2 #ct2-http).
func httpError(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, _ *http.Request, err error) {
	if hse, ok := errors.AsType[*runtime.HTTPStatusError](err); ok {
		writeError(w, hse.HTTPStatus, status.Convert(hse.Err))
		return
	}
	st := status.Convert(err)
	if st.Code() == codes.InvalidArgument && wireerr.Reason(st) == "" && strings.Contains(st.Message(), "http: request body too large") {
		// The gateway's decoding hit limitBody's bound (C2 #ct2-bad-input).
		writeError(w, http.StatusRequestEntityTooLarge, status.Convert(badInputStatus(
			invalidf("request", "the body is over the %d KiB bound (C2 #ct2-bad-input)", maxHTTPBody>>10))))
		return
	}
	writeError(w, runtime.HTTPStatusFromCode(st.Code()), st)
}

// routingError answers a request no route takes: 404 for an unknown path,
// 405 for a known path with another method, 400 for a malformed one.
func routingError(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, _ *http.Request, httpStatus int) {
	code := codes.NotFound
	switch httpStatus {
	case http.StatusMethodNotAllowed:
		code = codes.Unimplemented
	case http.StatusBadRequest:
		code = codes.InvalidArgument
	}
	writeError(w, httpStatus, status.New(code, http.StatusText(httpStatus)))
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
