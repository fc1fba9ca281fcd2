// The HTTP/JSON transport (C2 #ct2-http): LockApi over lockd's HTTP routes
// (`lock.server.http.listen`), for Node processes that reach lockd through
// HTTP/1.1 only. Every call is the route of the gRPC call of the same name;
// the shared KeepAlive stream is emulated by one `Heartbeat` call
// (`POST /v1/sessions/{id}:keepalive`) per heartbeat, so the KeepAliver's
// schedule and the session's deadline rules (C2 #ct2-deadline, #ct2-sdk) are
// the gRPC path's, unchanged: the send time is read before the call is
// written, an answer extends trust from that time, an error answer never
// does, and a broken connection ends the emulated stream (reconnect with
// backoff, C2 #ct2-sdk rule 11; move on with several addresses).
import * as http from "node:http";
import * as https from "node:https";
import { checkServerIdentity } from "node:tls";
import { create, fromJson, toJson, type DescMessage, type JsonValue, type MessageShape } from "@bufbuild/protobuf";
import {
  HeartbeatRequestSchema, KeepAliveResponseSchema, LockService,
  type AcquireRequest, type CheckTokenRequest, type CloseSessionRequest, type CloseSessionsRequest,
  type HotKeysRequest, type InspectRequest, type KeepAliveRequest, type KeepAliveResponse, type LeaveQueueRequest, type ListRequest,
  type ListSessionsRequest, type OpenSessionRequest, type ReleaseRequest, type RevokeRequest, type SetValueRequest,
  type WatchRequest, type WatchResponse,
} from "./gen/lockd/v1/lockd_pb.js";
import { fromCode, InternalError, LockdError, UnavailableError, type StatusDetails } from "./errors.js";
import { Replicas } from "./replicas.js";
import { type BidiStream, type CallOpts, type LockApi, type ServerStream } from "./rpc.js";

/** An HTTP answer: its status and body. */
export interface HttpReply {
  status: number;
  body: string;
}

/**
 * What HttpApi sends with: one request, answered or rejected (a connection
 * that failed, or `signal` aborted); and a streamed GET whose body arrives in
 * chunks (Watch). Tests give a fake.
 */
export interface HttpTransport {
  send(addr: string, verb: "GET" | "POST", path: string, body: string | undefined, signal: AbortSignal): Promise<HttpReply>;
  stream(addr: string, path: string, signal: AbortSignal, onStatus: (status: number) => void, onChunk: (s: string) => void,
    onEnd: (err: unknown) => void): void;
}

/**
 * The largest answer body read (and, in a Watch stream, the longest line):
 * 4 MiB, the receive bound of the gRPC transport (grpc-js's default
 * grpc.max_receive_message_length, which GrpcApi keeps). A larger answer is
 * an AnswerTooLargeError, never buffered whole.
 */
export const MAX_ANSWER_BYTES = 4 * 1024 * 1024;

/** An answer over MAX_ANSWER_BYTES: not retryable (the same call gets the same answer). */
export class AnswerTooLargeError extends InternalError {}

function tooLarge(what: string): AnswerTooLargeError {
  return new AnswerTooLargeError(`${what}: the answer is over ${MAX_ANSWER_BYTES >> 20} MiB, the bound of an answer (the gRPC transport's too)`);
}

/** A call that got no HTTP answer (the connection failed): retryable, and it ends an emulated KeepAlive stream. */
export class ConnectionError extends UnavailableError {}

/** What nodeTransport needs: TLS material (https) and the bearer token. */
export interface NodeHttpConfig {
  tls?: { ca: Buffer | null; cert: Buffer | null; key: Buffer | null; serverName?: string };
  authorization?: string;
}

function hostPort(addr: string): { host: string; port: number } {
  const i = addr.lastIndexOf(":");
  return { host: addr.slice(0, i).replace(/^\[|\]$/g, ""), port: Number(addr.slice(i + 1)) };
}

/** The transport over node:http / node:https, one keep-alive agent per client. */
export function nodeTransport(cfg: NodeHttpConfig): HttpTransport & { close(): void } {
  const t = cfg.tls;
  const agent = t
    ? new https.Agent({ keepAlive: true, ca: t.ca ?? undefined, cert: t.cert ?? undefined, key: t.key ?? undefined })
    : new http.Agent({ keepAlive: true });
  const request = (addr: string, verb: string, path: string, body: string | undefined, signal: AbortSignal,
    onRes: (res: http.IncomingMessage) => void, onErr: (err: unknown) => void) => {
    const headers: Record<string, string> = { accept: "application/json" };
    if (body !== undefined) {
      headers["content-type"] = "application/json";
      headers["content-length"] = String(Buffer.byteLength(body));
    }
    if (cfg.authorization) headers["authorization"] = cfg.authorization;
    const o: https.RequestOptions = { ...hostPort(addr), method: verb, path, headers, agent, signal };
    if (t?.serverName) {
      o.servername = t.serverName;
      o.checkServerIdentity = (_host, cert) => checkServerIdentity(t.serverName!, cert);
    }
    const req = (t ? https : http).request(o, onRes);
    req.on("error", onErr);
    req.end(body);
  };
  return {
    send: (addr, verb, path, body, signal) => new Promise((resolve, reject) => {
      request(addr, verb, path, body, signal, (res) => {
        const chunks: Buffer[] = [];
        let n = 0;
        res.on("data", (c: Buffer) => {
          n += c.length;
          if (n > MAX_ANSWER_BYTES) {
            res.destroy();
            reject(tooLarge(`${verb} ${path.split("?")[0]}`));
            return;
          }
          chunks.push(c);
        });
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString("utf8") }));
        res.on("error", reject);
      }, reject);
    }),
    stream: (addr, path, signal, onStatus, onChunk, onEnd) => {
      let ended = false;
      const end = (err: unknown) => {
        if (!ended) {
          ended = true;
          onEnd(err);
        }
      };
      request(addr, "GET", path, undefined, signal, (res) => {
        onStatus(res.statusCode ?? 0);
        res.setEncoding("utf8");
        res.on("data", (c: string) => onChunk(c));
        res.on("end", () => end(new ConnectionError("watch stream ended")));
        res.on("error", end);
      }, end);
    },
    close: () => agent.destroy(),
  };
}

type Method = (typeof LockService.method)[keyof typeof LockService.method];

/** A route of lockd_http.yaml: its verb, its path from the request, and the fields the path carries. */
export interface Route {
  verb: "GET" | "POST";
  path: (r: Record<string, unknown>) => string;
  inPath: string[];
}

const seg = (s: unknown) => encodeURIComponent(String(s ?? ""));
/** A key in a path: its `/` kept, every other byte that is not unreserved percent-encoded (C2 #ct2-http). */
const keyPath = (k: unknown) => String(k ?? "").split("/").map(encodeURIComponent).join("/");
const onKey = (verb: "GET" | "POST", prefix: string, suffix: string): Route =>
  ({ verb, path: (r) => `${prefix}${keyPath(r["key"])}${suffix}`, inPath: ["key"] });
const onSession = (suffix: string): Route =>
  ({ verb: "POST", path: (r) => `/v1/sessions/${seg(r["session_id"])}${suffix}`, inPath: ["session_id"] });

/** Acquire's additional binding for several keys at once (C2 #ct2-acquire-all): the keys in the body. */
const ACQUIRE_ALL: Route = { verb: "POST", path: () => "/v1/locks:acquire", inPath: [] };

const ROUTES: Partial<Record<string, Route>> = {
  OpenSession: { verb: "POST", path: () => "/v1/sessions", inPath: [] },
  Heartbeat: onSession(":keepalive"),
  CloseSession: onSession(":close"),
  Acquire: onKey("POST", "/v1/locks/", ":acquire"), // several keys: ACQUIRE_ALL
  HotKeys: { verb: "GET", path: () => "/v1/hotkeys", inPath: [] },
  Release: onKey("POST", "/v1/locks/", ":release"),
  Revoke: onKey("POST", "/v1/locks/", ":revoke"),
  LeaveQueue: onKey("POST", "/v1/locks/", ":leave"),
  SetValue: onKey("POST", "/v1/locks/", ":value"),
  Inspect: onKey("GET", "/v1/locks/", ""),
  CheckToken: onKey("GET", "/v1/tokens/", ""),
  List: { verb: "GET", path: () => "/v1/locks", inPath: [] },
  ListSessions: { verb: "GET", path: () => "/v1/sessions", inPath: [] },
  CloseSessions: { verb: "POST", path: () => "/v1/sessions:closeAll", inPath: [] },
  Watch: { verb: "GET", path: () => "/v1/watch", inPath: [] },
};

/**
 * A field named like a secret (a session secret, a password, a credential, a
 * bearer token): never put into a URL query, which proxies and access logs
 * keep. Not `token` (a fencing token) nor `page_token` (a List cursor).
 */
const SECRET_FIELD = /secret|passw|credential|authoriz|bearer|api_?key|private/i;

/**
 * The path and body (POST) or query (GET) of a request on its route. A
 * secret field (SECRET_FIELD) of a GET is refused: such a route must be a
 * POST (C2 #ct2-http).
 * @internal exported for the unit tests
 */
export function encode(route: Route, schema: DescMessage, req: unknown): { path: string; body?: string } {
  const j = toJson(schema, req as MessageShape<DescMessage>, { useProtoFieldName: true }) as Record<string, JsonValue>;
  const path = route.path(j);
  for (const f of route.inPath) delete j[f];
  if (route.verb === "POST") return { path, body: JSON.stringify(j) };
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(j)) {
    if (v === null || typeof v === "object") continue;
    if (SECRET_FIELD.test(k)) throw new InternalError(`${schema.typeName}.${k}: a secret is never sent in a URL query; its route must be a POST (C2 #ct2-http)`);
    q.append(k, String(v));
  }
  const qs = q.toString();
  return { path: qs ? `${path}?${qs}` : path };
}

/** The SDK's error for an HTTP answer that is not 200: the google.rpc.Status JSON of C2 #ct2-http, else by status. */
export function httpError(status: number, body: string): LockdError {
  let st: { code?: number; message?: string; reason?: string; details?: Record<string, unknown>[] } | undefined;
  try {
    st = JSON.parse(body) as typeof st;
  } catch {
    st = undefined;
  }
  if (!st || typeof st.code !== "number") {
    const msg = `HTTP ${status}: ${body.slice(0, 200).trim()}`;
    return status === 502 || status === 503 || status === 504 ? new UnavailableError(msg) : new InternalError(msg);
  }
  const d: StatusDetails = { reason: st.reason ?? "", metadata: {} };
  for (const x of st.details ?? []) {
    const type = String(x["@type"] ?? "");
    if (type.endsWith("google.rpc.ErrorInfo")) {
      d.reason = String(x["reason"] ?? d.reason);
      d.metadata = (x["metadata"] as Record<string, string> | undefined) ?? {};
    } else if (type.endsWith("google.rpc.BadRequest") && d.field === undefined) {
      const v = (x["fieldViolations"] ?? x["field_violations"]) as { field?: string; description?: string }[] | undefined;
      if (v?.[0]) {
        d.field = v[0].field ?? "";
        d.description = v[0].description ?? "";
      }
    }
  }
  return fromCode(st.code, d.reason, st.message ?? "", d);
}

/** What HttpApi needs to reach the replicas' HTTP listeners. */
export interface HttpConfig {
  addresses: string[];
  transport: HttpTransport & { close?(): void };
  now: () => number;
}

/** The HTTP/JSON implementation of LockApi (C2 #ct2-http), with the replica moves of GrpcApi (C2 #ct2-failover). */
export class HttpApi implements LockApi {
  private readonly replicas: Replicas;
  private closed = false;

  constructor(private readonly cfg: HttpConfig) {
    this.replicas = new Replicas(cfg.addresses, cfg.now);
  }

  get several(): boolean {
    return this.replicas.several;
  }

  setAside(peer: string, draining: boolean): boolean {
    return this.replicas.setAside(peer, draining);
  }

  clearAside(): void {
    this.replicas.clearAside();
  }

  /** One call of method m to addr; errors mapped, the replica moves of a failed call applied. */
  private async call<M extends Method>(addr: string, m: M, req: MessageShape<M["input"]>, signal?: AbortSignal): Promise<MessageShape<M["output"]>> {
    if (this.closed) throw new UnavailableError("client closed");
    const route = m.name === "Acquire" && (req as AcquireRequest).keys?.length ? ACQUIRE_ALL : ROUTES[m.name];
    if (!route) throw new InternalError(`${m.name} has no HTTP route (C2 #ct2-http)`);
    signal?.throwIfAborted();
    const { path, body } = encode(route, m.input, req);
    const ac = new AbortController();
    let moved = false;
    const move = () => {
      moved = true;
      ac.abort();
    };
    const done = this.replicas.track(addr, move);
    const onAbort = () => ac.abort(signal!.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    let reply: HttpReply;
    try {
      reply = await this.cfg.transport.send(addr, route.verb, path, body, ac.signal);
    } catch (err) {
      if (signal?.aborted) throw signal.reason;
      if (moved) throw new ConnectionError(`${m.name}: moved off replica ${addr}, set aside`);
      if (err instanceof AnswerTooLargeError) throw err;
      this.replicas.failed(addr);
      throw new ConnectionError(`${m.name} to ${addr}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    } finally {
      signal?.removeEventListener("abort", onAbort);
      done();
    }
    if (reply.body.length > MAX_ANSWER_BYTES) throw tooLarge(m.name); // a transport of the caller's that did not bound it
    if (reply.status !== 200) {
      const err = httpError(reply.status, reply.body);
      this.replicas.answered(addr, err);
      throw err;
    }
    try {
      return fromJson(m.output, JSON.parse(reply.body) as JsonValue, { ignoreUnknownFields: true }) as MessageShape<M["output"]>;
    } catch (err) {
      throw new InternalError(`${m.name}: undecodable answer: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  private unary<M extends Method>(m: M, req: MessageShape<M["input"]>, o?: CallOpts) {
    return this.call(this.replicas.pick(), m, req, o?.signal);
  }

  openSession(req: OpenSessionRequest, o?: CallOpts) { return this.unary(LockService.method.openSession, req, o); }
  closeSession(req: CloseSessionRequest, o?: CallOpts) { return this.unary(LockService.method.closeSession, req, o); }
  acquire(req: AcquireRequest, o?: CallOpts) { return this.unary(LockService.method.acquire, req, o); }
  leaveQueue(req: LeaveQueueRequest, o?: CallOpts) { return this.unary(LockService.method.leaveQueue, req, o); }
  release(req: ReleaseRequest, o?: CallOpts) { return this.unary(LockService.method.release, req, o); }
  setValue(req: SetValueRequest, o?: CallOpts) { return this.unary(LockService.method.setValue, req, o); }
  inspect(req: InspectRequest, o?: CallOpts) { return this.unary(LockService.method.inspect, req, o); }
  checkToken(req: CheckTokenRequest, o?: CallOpts) { return this.unary(LockService.method.checkToken, req, o); }
  list(req: ListRequest, o?: CallOpts) { return this.unary(LockService.method.list, req, o); }
  revoke(req: RevokeRequest, o?: CallOpts) { return this.unary(LockService.method.revoke, req, o); }
  listSessions(req: ListSessionsRequest, o?: CallOpts) { return this.unary(LockService.method.listSessions, req, o); }
  hotKeys(req: HotKeysRequest, o?: CallOpts) { return this.unary(LockService.method.hotKeys, req, o); }
  closeSessions(req: CloseSessionsRequest, o?: CallOpts) { return this.unary(LockService.method.closeSessions, req, o); }

  /**
   * The KeepAlive stream, emulated: each heartbeat is one Heartbeat call to
   * the replica the stream was opened on, and its answer is delivered as the
   * KeepAliveResponse to that request (request_id echoed). An error answer
   * with a reason (a refused secret, a transient backend error) is the
   * heartbeat's error answer, which never extends trust; a call without an
   * HTTP answer, or one without a reason or SHUTTING_DOWN, breaks the stream.
   */
  keepAlive(): BidiStream<KeepAliveRequest, KeepAliveResponse> {
    const addr = this.replicas.pick();
    const ac = new AbortController();
    let onMessage: (m: KeepAliveResponse) => void = () => undefined;
    let onEnd: (err: unknown) => void = () => undefined;
    let done = false;
    const end = (err: unknown) => {
      if (done) return;
      done = true;
      ac.abort();
      onEnd(err);
    };
    return {
      peer: addr,
      send: (k: KeepAliveRequest) => {
        if (done) return;
        const req = create(HeartbeatRequestSchema, { sessionId: k.sessionId, sessionSecret: k.sessionSecret, ack: k.ack });
        const base = { sessionId: k.sessionId, requestId: k.requestId };
        this.call(addr, LockService.method.heartbeat, req, ac.signal).then((r) => {
          if (!done) onMessage(create(KeepAliveResponseSchema, { ...base, live: r.live, remainingMs: r.remainingMs, held: r.held, lost: r.lost, draining: r.draining }));
        }, (err: unknown) => {
          if (done) return;
          if (err instanceof LockdError && !(err instanceof ConnectionError) && err.reason !== "" && err.reason !== "SHUTTING_DOWN") {
            onMessage(create(KeepAliveResponseSchema, { ...base, error: { code: err.code ?? 2, reason: err.reason, message: err.message } }));
          } else {
            end(err);
          }
        });
      },
      start: (m, e) => {
        onMessage = m;
        onEnd = e;
      },
      cancel: () => {
        done = true;
        ac.abort();
      },
    };
  }

  /** Watch over `GET /v1/watch`: grpc-gateway's stream of `{"result": …}` / `{"error": …}` JSON lines. */
  watch(req: WatchRequest): ServerStream<WatchResponse> {
    const addr = this.replicas.pick();
    const ac = new AbortController();
    const { path } = encode(ROUTES["Watch"]!, LockService.method.watch.input, req);
    let cancelled = false;
    return {
      peer: addr,
      start: (onMessage, onEnd) => {
        let status = 0;
        let buf = "";
        let failed = false;
        const end = (err: unknown) => {
          if (cancelled || failed) return;
          failed = true;
          ac.abort();
          this.replicas.answered(addr, err);
          onEnd(err);
        };
        this.cfg.transport.stream(addr, path, ac.signal, (s) => void (status = s), (chunk) => {
          buf += chunk;
          if (buf.length > MAX_ANSWER_BYTES) {
            end(tooLarge("Watch"));
            return;
          }
          if (status !== 200) return; // the error body is read whole at the end
          for (let i = buf.indexOf("\n"); i >= 0 && !failed && !cancelled; i = buf.indexOf("\n")) {
            const line = buf.slice(0, i).trim();
            buf = buf.slice(i + 1);
            if (!line) continue;
            try {
              const v = JSON.parse(line) as { result?: JsonValue; error?: unknown };
              if (v.error !== undefined) end(httpError(500, JSON.stringify(v.error)));
              else onMessage(fromJson(LockService.method.watch.output, v.result ?? {}, { ignoreUnknownFields: true }));
            } catch (err) {
              end(new InternalError(`watch: undecodable line: ${err instanceof Error ? err.message : String(err)}`));
            }
          }
        }, (err) => {
          if (status !== 200 && status !== 0) end(httpError(status, buf));
          else end(err instanceof LockdError ? err : new ConnectionError(`watch to ${addr}: ${String(err)}`, { cause: err }));
        });
      },
      cancel: () => {
        cancelled = true;
        ac.abort();
      },
    };
  }

  close(): void {
    this.closed = true;
    this.cfg.transport.close?.();
  }
}
