// Command lockd is the lockd distributed lock service and its command-line
// client: `lockd serve` runs the server, `lockd run KEY -- CMD` runs a
// command under a lock, and inspect, ls, revoke and watch look at locks.
// See internal/cli for the subcommands.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc/grpclog"

	"lock.dev/lockd/internal/cli"
	"lock.dev/lockd/server"
)

func main() {
	// grpc-go's own log lines become JSON events of lockd serve's logger,
	// rate-limited (C4 grpc_log); set before anything of gRPC runs.
	grpclog.SetLoggerV2(server.GRPCLogger())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
