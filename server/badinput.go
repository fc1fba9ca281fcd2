package server

import (
	"errors"
	"net/http"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// Bad input (C2 #ct2-bad-input): a request with invalid UTF-8 in a string
// field, or over MaxRecvMsgSize, is INVALID_ARGUMENT naming the field
// ("request" for the message as a whole), never INTERNAL or
// RESOURCE_EXHAUSTED. The gRPC servers read messages up to maxReadMsgSize
// so that the codec (codec.go) can answer one over MaxRecvMsgSize itself;
// the HTTP gateway checks what it is about to send (gatewayConn, checkOut).

// maxReadMsgSize is what the transport reads of one request message: up to
// it, a message over MaxRecvMsgSize is answered INVALID_ARGUMENT with a
// reason; beyond it grpc-go refuses it unread (RESOURCE_EXHAUSTED). It is
// the HTTP body bound too.
const maxReadMsgSize = 4 * MaxRecvMsgSize

// errOversized is the answer to a request message of n bytes.
func errOversized(n int) error {
	return invalidf("request", "the message is %d bytes, over the %d KiB bound (C2 #ct2-bad-input)", n, MaxRecvMsgSize>>10)
}

// errBadUTF8Field is the answer to a request whose field (a proto field
// path) is not valid UTF-8.
func errBadUTF8Field(field string) error {
	return invalidf(field, "not valid UTF-8 (C2 #ct2-bad-input)")
}

// badWire finds why the encoded message b of descriptor md did not decode:
// the path of a string field whose value is not valid UTF-8 ("labels.key"
// inside a nested message or map), or "" when that is not the cause.
func badWire(md protoreflect.MessageDescriptor, b []byte) string {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd != nil && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return ""
			}
			switch fd.Kind() {
			case protoreflect.StringKind:
				if !utf8.Valid(v) {
					return string(fd.Name())
				}
			case protoreflect.MessageKind:
				if sub := badWire(fd.Message(), v); sub != "" {
					return string(fd.Name()) + "." + sub
				}
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return ""
		}
		b = b[m:]
	}
	return ""
}

// badUTF8 is the path of a string field of m that is not valid UTF-8, or "".
func badUTF8(m protoreflect.Message) string {
	var bad string
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := string(fd.Name())
		switch {
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				if s, ok := k.Interface().(string); ok && !utf8.ValidString(s) {
					bad = name + ".key"
				} else if fd.MapValue().Kind() == protoreflect.StringKind && !utf8.ValidString(mv.String()) {
					bad = name + ".value"
				}
				return bad == ""
			})
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len() && bad == ""; i++ {
				bad = badValue(fd, l.Get(i), name)
			}
		default:
			bad = badValue(fd, v, name)
		}
		return bad == ""
	})
	return bad
}

func badValue(fd protoreflect.FieldDescriptor, v protoreflect.Value, name string) string {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if !utf8.ValidString(v.String()) {
			return name
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if sub := badUTF8(v.Message()); sub != "" {
			return name + "." + sub
		}
	}
	return ""
}

// checkOut checks a request the HTTP gateway is about to send on the
// in-process hop: invalid UTF-8 would fail to marshal there (INTERNAL) and
// an oversized message would be refused by the transport
// (RESOURCE_EXHAUSTED without a reason). Both are the caller's bad input:
// INVALID_ARGUMENT, and HTTP 413 for the size (C2 #ct2-bad-input).
func checkOut(req any) error {
	m, ok := req.(proto.Message)
	if !ok {
		return nil
	}
	if f := badUTF8(m.ProtoReflect()); f != "" {
		return badInputStatus(errBadUTF8Field(f))
	}
	if n := proto.Size(m); n > MaxRecvMsgSize {
		return &runtime.HTTPStatusError{HTTPStatus: http.StatusRequestEntityTooLarge, Err: badInputStatus(errOversized(n))}
	}
	return nil
}

// badInputStatus is the wire status of a *fieldError.
func badInputStatus(err error) error {
	fe, ok := errors.AsType[*fieldError](err)
	if !ok {
		return err
	}
	return wireerr.Status(wireerr.ReasonInvalidArgument, fe.Error(), new(fe.violation())).Err()
}
