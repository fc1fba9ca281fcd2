package server_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// rawCodec sends pre-encoded bytes as they are, so a test can put bytes on
// the wire that a Go client would refuse to encode; replies decode as proto.
type rawCodec struct{ encoding.CodecV2 }

func (rawCodec) Name() string { return "proto" }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.(*[]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// TestInvalidUTF8OnTheWire: a non-Go client can send a key that is not valid
// UTF-8; it must get InvalidArgument naming the field, not Internal (C2
// #ct2-bad-input). A message over MaxRecvMsgSize is InvalidArgument naming
// the request, not ResourceExhausted without a reason.
func TestInvalidUTF8OnTheWire(t *testing.T) {
	srv := lockdtest.StartBackend(t, backend.Etcd, lockdtest.Options{NoClient: true})
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(grpcproto.Name)})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := testCtx(t, 30*time.Second)
	bad := func(m proto.Message) *[]byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.Replace(b, []byte("PLACEHOLDER"), []byte("bad\xff\xfekeyss!"), 1) // same length (11 bytes)
		return &b
	}
	for _, tc := range []struct {
		method string
		req    *[]byte
		resp   proto.Message
		field  string
	}{
		{"/lockd.v1.LockService/Inspect", bad(&lockdv1.InspectRequest{Key: "PLACEHOLDER"}), &lockdv1.InspectResponse{}, "key"},
		{"/lockd.v1.LockService/Acquire", bad(&lockdv1.AcquireRequest{SessionId: "x", Key: "PLACEHOLDER"}), &lockdv1.AcquireResponse{}, "key"},
		{"/lockd.v1.LockService/Acquire", bad(&lockdv1.AcquireRequest{SessionId: "PLACEHOLDER", Key: "k"}), &lockdv1.AcquireResponse{}, "session_id"},
		{"/lockd.v1.LockService/List", bad(&lockdv1.ListRequest{Prefix: "PLACEHOLDER"}), &lockdv1.ListResponse{}, "prefix"},
		{"/lockd.v1.LockService/List", &[]byte{0xff, 0xff, 0xff}, &lockdv1.ListResponse{}, "request"},
		{"/lockd.v1.LockService/List", oversized(t), &lockdv1.ListResponse{}, "request"},
	} {
		err := conn.Invoke(ctx, tc.method, tc.req, tc.resp)
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument || reason(err) != wireerr.ReasonInvalidArgument {
			t.Errorf("%s with bad input (%s): %v (reason %q), want InvalidArgument/%s", tc.method, tc.field, err, reason(err), wireerr.ReasonInvalidArgument)
		}
		if v, ok := wireerr.FieldViolation(st); !ok || v.Field != tc.field {
			t.Errorf("%s with bad input: violation %+v (present %v); want field %q", tc.method, v, ok, tc.field)
		}
	}
	// A streaming RPC too.
	desc := &grpc.StreamDesc{StreamName: "Watch", ServerStreams: true}
	cs, err := conn.NewStream(ctx, desc, "/lockd.v1.LockService/Watch")
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(bad(&lockdv1.WatchRequest{Prefix: "PLACEHOLDER"})); err != nil {
		t.Fatal(err)
	}
	_ = cs.CloseSend()
	if err := cs.RecvMsg(&lockdv1.WatchResponse{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Watch with invalid UTF-8: %v, want InvalidArgument", err)
	}
}

// oversized is a List request of 100 KiB: over MaxRecvMsgSize, under what
// the transport reads.
func oversized(t *testing.T) *[]byte {
	b, err := proto.Marshal(&lockdv1.ListRequest{Prefix: strings.Repeat("p", 100<<10)})
	if err != nil {
		t.Fatal(err)
	}
	return &b
}
