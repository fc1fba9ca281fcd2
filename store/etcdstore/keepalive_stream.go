package etcdstore

import (
	"context"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The keeper's LeaseKeepAlive streams: one goroutine per stream (runStream,
// plus its receiver) moves bytes; the keeper's owner goroutine decides what
// to send and interprets every answer (keepalive.go).

// kaEvent is what a stream reports to the owner: an answer or the error
// that ended the stream.
type kaEvent struct {
	gen  uint64
	resp *pb.LeaseKeepAliveResponse
	err  error
}

// kaStream is one LeaseKeepAlive stream. Requests queued before the stream
// is open are sent once it is.
type kaStream struct {
	gen    uint64
	cancel context.CancelFunc
	kick   chan struct{} // capacity 1

	mu      sync.Mutex
	pending []int64
}

func (st *kaStream) enqueue(lease clientv3.LeaseID) {
	st.mu.Lock()
	st.pending = append(st.pending, int64(lease))
	st.mu.Unlock()
	select {
	case st.kick <- struct{}{}:
	default:
	}
}

func (st *kaStream) take() []int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	p := st.pending
	st.pending = nil
	return p
}

// startStream opens stream gen in the background.
func (k *keeper) startStream(gen uint64) *kaStream {
	ctx, cancel := context.WithCancel(k.ctx)
	st := &kaStream{gen: gen, cancel: cancel, kick: make(chan struct{}, 1)}
	k.wg.Add(1)
	go k.runStream(ctx, st) // exits when the stream breaks or ctx is cancelled (teardown, Close)
	return st
}

func (k *keeper) runStream(ctx context.Context, st *kaStream) {
	defer k.wg.Done()
	stream, err := k.lc.LeaseKeepAlive(clientv3.WithRequireLeader(ctx))
	if err != nil {
		k.report(ctx, kaEvent{gen: st.gen, err: err})
		return
	}
	recvDone := make(chan struct{})
	go func() { // exits when the stream breaks; cancelling ctx breaks it
		defer close(recvDone)
		for {
			resp, err := stream.Recv()
			if err != nil {
				k.report(ctx, kaEvent{gen: st.gen, err: err})
				return
			}
			k.report(ctx, kaEvent{gen: st.gen, resp: resp})
		}
	}()
	defer func() {
		st.cancel()
		<-recvDone
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-recvDone:
			return
		case <-st.kick:
		}
		for _, id := range st.take() {
			if k.beforeSend != nil {
				k.beforeSend(clientv3.LeaseID(id))
			}
			if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: id}); err != nil {
				k.report(ctx, kaEvent{gen: st.gen, err: err})
				return
			}
		}
	}
}

// report hands an event to the owner, or drops it once the stream is torn
// down.
func (k *keeper) report(ctx context.Context, ev kaEvent) {
	select {
	case k.events <- ev:
	case <-ctx.Done():
	}
}
