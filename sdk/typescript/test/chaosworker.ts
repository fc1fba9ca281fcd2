// The chaos worker's entry (the worker is chaosworker_impl.ts): it takes
// SIGTERM and SIGINT before it loads the SDK, gRPC and protobuf, which take
// hundreds of milliseconds on a loaded machine. A stop the harness sends to
// a worker it has just (re)started would otherwise find Node's default
// action and end the process by the signal, without a history (it did in a
// kill-holder run: "w1.2 exited: signal: terminated"). A stop now ends the
// worker after its current grant, or before its first, with exit status 0.
const stop = new AbortController();
const onSignal = () => stop.abort(new Error("stopped")); // ends a waiting acquire; a held grant is finished properly
process.on("SIGTERM", onSignal);
process.on("SIGINT", onSignal);
const { main } = await import("./chaosworker_impl.js");
process.exit(await main(process.argv.slice(2), stop));
