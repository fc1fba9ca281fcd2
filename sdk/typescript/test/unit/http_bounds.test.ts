// The HTTP transport's bounds (src/http.ts): a secret field never goes into
// a URL query, and an answer over MAX_ANSWER_BYTES (the gRPC transport's
// receive bound) is refused with a clear error instead of buffered whole —
// over node:http from a real local server, and in a Watch stream.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { create } from "@bufbuild/protobuf";
import {
  AnswerTooLargeError, encode, HttpApi, MAX_ANSWER_BYTES, nodeTransport, type HttpReply, type HttpTransport,
} from "../../src/http.js";
import { InternalError, UnavailableError } from "../../src/errors.js";
import { HeartbeatRequestSchema, ListRequestSchema, WatchRequestSchema } from "../../src/gen/lockd/v1/lockd_pb.js";

test("over HTTP: a GET never carries a secret field in its query; a POST carries it in the body", () => {
  const req = create(HeartbeatRequestSchema, { sessionId: "S/1", sessionSecret: new Uint8Array([1, 2, 3]) });
  const get = { verb: "GET" as const, path: () => "/v1/x", inPath: [] };
  assert.throws(() => encode(get, HeartbeatRequestSchema, req),
    (e: unknown) => e instanceof InternalError && /session_secret: a secret is never sent in a URL query/.test(e.message));
  // The control: the same request on a POST route keeps the secret in the body.
  const post = encode({ ...get, verb: "POST" }, HeartbeatRequestSchema, req);
  assert.equal(post.path, "/v1/x");
  assert.match(post.body ?? "", /"session_secret":"AQID"/);
  // Fields named token (a fencing token) and page_token (a cursor) still go into a query.
  assert.equal(encode(get, ListRequestSchema, create(ListRequestSchema, { prefix: "a/", pageToken: "p1" })).path, "/v1/x?prefix=a%2F&page_token=p1");
});

/** A local HTTP server answering every request with a JSON body of exactly n bytes. */
async function serve(n: number): Promise<{ addr: string; close(): Promise<void> }> {
  const head = '{"locks":[]}';
  const srv = http.createServer((_req, res) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(head + " ".repeat(n - head.length));
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const port = (srv.address() as AddressInfo).port;
  return { addr: `127.0.0.1:${port}`, close: () => new Promise((r) => { srv.closeAllConnections(); srv.close(() => r()); }) };
}

test("over HTTP: an answer over MAX_ANSWER_BYTES is refused, not retried; one of exactly the bound is read", async () => {
  for (const [n, over] of [[MAX_ANSWER_BYTES, false], [MAX_ANSWER_BYTES + 1, true]] as const) {
    const srv = await serve(n);
    const transport = nodeTransport({});
    const api = new HttpApi({ addresses: [srv.addr], transport, now: () => Date.now() });
    try {
      const p = api.list(create(ListRequestSchema, {}));
      if (over) {
        // Not UnavailableError: a retry would get the same answer.
        await assert.rejects(p, (e: unknown) => e instanceof AnswerTooLargeError && !(e instanceof UnavailableError) &&
          /GET \/v1\/locks: the answer is over 4 MiB/.test(e.message));
      } else {
        assert.deepEqual((await p).locks, []);
      }
    } finally {
      api.close();
      await srv.close();
    }
  }
});

test("over HTTP: a Watch line over MAX_ANSWER_BYTES ends the stream with AnswerTooLargeError", async () => {
  const transport: HttpTransport = {
    send: (): Promise<HttpReply> => Promise.reject(new Error("not used")),
    stream: (_addr, _path, _signal, onStatus, onChunk) => {
      onStatus(200);
      onChunk("x".repeat(MAX_ANSWER_BYTES)); // no newline yet: still within the bound
      onChunk("x");
    },
  };
  const api = new HttpApi({ addresses: ["127.0.0.1:1"], transport, now: () => Date.now() });
  const ended = await new Promise<unknown>((resolve) => api.watch(create(WatchRequestSchema, {})).start(() => undefined, resolve));
  assert.ok(ended instanceof AnswerTooLargeError, `ended with ${String(ended)}`);
  api.close();
});
