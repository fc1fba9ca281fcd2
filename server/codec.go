package server

import (
	"context"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A request that does not decode — most often because a string field (a
// key) is not valid UTF-8, which proto3 forbids — is answered by grpc-go with
// Internal before any handler runs. It is the client's bad input, so it must
// be InvalidArgument (C2 #ct2-keys): the server's codec lets such a request
// through marked as bad, and the interceptors below answer it with
// InvalidArgument before it reaches a handler. (Go clients cannot send such
// requests; other clients can.)

// badRequests marks request messages whose decoding failed. Entries live
// from decoding until an interceptor checks them, which every decoded
// request passes. n counts the entries, so that the common case (no bad
// request anywhere) costs the interceptors one atomic load.
type badRequests struct {
	m sync.Map
	n atomic.Int64
}

// mark records that v failed to decode, and why (a *fieldError).
func (b *badRequests) mark(v any, why error) {
	if _, loaded := b.m.LoadOrStore(v, why); !loaded {
		b.n.Add(1)
	}
}

// take returns why v was marked bad (nil: it was not), and forgets it. The
// decoding of a request happens before, and on the same goroutine as, its
// interceptor.
func (b *badRequests) take(v any) error {
	if b.n.Load() == 0 {
		return nil
	}
	if why, bad := b.m.LoadAndDelete(v); bad {
		b.n.Add(-1)
		return why.(error)
	}
	return nil
}

// requestCodec is the standard proto codec, except that a request that does
// not decode is marked bad instead of failing (see above).
type requestCodec struct {
	encoding.CodecV2
	bad *badRequests
}

func newRequestCodec(bad *badRequests) requestCodec {
	return requestCodec{CodecV2: encoding.GetCodecV2(proto.Name), bad: bad}
}

func (c requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if n := data.Len(); n > MaxRecvMsgSize {
		c.bad.mark(v, errOversized(n)) // C2 #ct2-bad-input; not decoded
		return nil
	}
	if err := c.CodecV2.Unmarshal(data, v); err != nil {
		c.bad.mark(v, whyBad(data, v))
	}
	return nil
}

// whyBad names the field of a request that failed to decode: the string
// field that is not valid UTF-8, else the request as a whole.
func whyBad(data mem.BufferSlice, v any) error {
	if m, ok := v.(protoreflect.ProtoMessage); ok {
		buf := data.Materialize()
		if f := badWire(m.ProtoReflect().Descriptor(), buf); f != "" {
			return errBadUTF8Field(f)
		}
	}
	return invalidf("request", "not a valid %s message (is every string field — key, prefix, session id, page token — valid UTF-8?)", "protobuf")
}

func (s *Server) unaryBadUTF8(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if why := s.bad.take(req); why != nil {
		return nil, s.toStatus(ctx, info.FullMethod, why)
	}
	return handler(ctx, req)
}

func (s *Server) streamBadUTF8(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &checkedStream{ServerStream: ss, s: s, method: info.FullMethod})
}

// checkedStream answers a streamed request with invalid UTF-8 like the
// unary interceptor does.
type checkedStream struct {
	grpc.ServerStream
	s      *Server
	method string
}

func (cs *checkedStream) RecvMsg(m any) error {
	if err := cs.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if why := cs.s.bad.take(m); why != nil {
		return cs.s.toStatus(cs.Context(), cs.method, why)
	}
	return nil
}
