// The shared KeepAlive stream: when each session heartbeats, what an answer
// or notice does, reconnects and moves between replicas (the Go SDK's
// keepalive.go and keepalive_reply.go; C2 #ct2-deadline, #ct2-confirm,
// #ct2-failover, #ct2-drain). Node runs it on its event loop: every step is
// a callback of the stream or of a timer on the client's clock.
import { create } from "@bufbuild/protobuf";
import type { Timer } from "./clock.js";
import { fromCode, PermissionDeniedError, SessionDeadError } from "./errors.js";
import { KeepAliveRequestSchema, type KeepAliveRequest, type KeepAliveResponse } from "./gen/lockd/v1/lockd_pb.js";
import type { BidiStream } from "./rpc.js";
import type { Client } from "./client.js";
import type { Session } from "./session.js";

/** How much earlier than due a heartbeat may go to share a wake-up: interval/10, at most 50 ms. */
export function beatSlack(intervalMs: number): number {
  return Math.min(intervalMs / 10, 50);
}

/** How long a stream may stay silent with a heartbeat unanswered before the client moves: interval/2, at least 250 ms. */
export function stallAfter(intervalMs: number): number {
  return Math.max(intervalMs / 2, 250);
}

/** The most stalled streams still sent heartbeats after a move (C2 #ct2-failover); an older one is only received on. */
export const maxShadows = 4;

interface Entry {
  s: Session;
  next: number; // when to send the next heartbeat
}

/** A heartbeat in flight: which session, when it was sent, and the session's lockSeq then. */
interface Beat {
  s: Session;
  sent: number;
  seq: number;
}

/** One KeepAlive stream and the heartbeats it carries. */
class Flight {
  beats = new Map<bigint, Beat>();
  replied = false; // anything came on it (a healthy stream: the backoff)
  kept = false; // a live answer to one of its heartbeats came: its replica keeps the session (the shadows stop)
  left = false; // left on purpose: notices are applied but not acknowledged
  sending = false; // left because it stalled, and still sent heartbeats until a later stream answers
  drainSeen = false;
  stallDone = false; // a stall was found with nowhere else to go
  nextId = 0n;
  lingerTimer?: Timer;
  constructor(readonly stream: BidiStream<KeepAliveRequest, KeepAliveResponse>, readonly gen: number, public lastRecv: number) {}
}

/** Sends the heartbeats of every session of a Client over one shared KeepAlive stream. */
export class KeepAliver {
  private readonly entries = new Map<string, Entry>();
  private cur?: Flight;
  private gen = 0;
  private attempt = 0;
  private openedAt = 0;
  private timer?: Timer;
  private reconnect?: Timer;
  private closed = false;
  private readonly lingering = new Set<Flight>();
  // Streams left because they stalled and still sent heartbeats (C2 #ct2-failover, "a stall move keeps sending"):
  // a stall is a guess, and a replica that is slow but answering must not lose the session by it.
  private shadows: Flight[] = [];

  constructor(private readonly c: Client) {}

  /** The random point in the last fifth of the interval at which a heartbeat is due. */
  private jitter(intervalMs: number): number {
    return intervalMs - Math.random() * (intervalMs / 5);
  }

  add(s: Session): void {
    this.entries.set(s.id, { s, next: this.c.clock.now() + this.jitter(s.intervalMs) });
    if (!this.cur && !this.reconnect) this.open();
    else this.schedule();
  }

  remove(s: Session): void {
    const e = this.entries.get(s.id);
    if (e?.s === s) this.entries.delete(s.id);
    if (this.entries.size === 0) {
      // No session left: no stream (Node may exit). A new session opens one.
      this.timer?.cancel();
      this.reconnect?.cancel();
      this.reconnect = undefined;
      const fl = this.cur;
      this.cur = undefined;
      fl?.stream.cancel();
    }
  }

  /** The sessions being kept alive. */
  sessions(): Session[] {
    return [...this.entries.values()].map((e) => e.s);
  }

  private open(): void {
    if (this.closed || this.entries.size === 0) return;
    const now = this.c.clock.now();
    const stream = this.c.api.keepAlive();
    const fl = new Flight(stream, ++this.gen, now);
    this.cur = fl;
    this.openedAt = now;
    stream.start((r) => this.onMessage(fl, r), (err) => this.onEnd(fl, err));
    for (const e of this.entries.values()) e.next = now; // every session beats at once on a new stream
    this.schedule();
  }

  private onMessage(fl: Flight, r: KeepAliveResponse): void {
    fl.replied = true;
    fl.lastRecv = this.c.clock.now();
    this.handle(r, fl);
    if (fl.left) this.linger(fl);
  }

  private onEnd(fl: Flight, err: unknown): void {
    if (fl.left) {
      fl.lingerTimer?.cancel();
      this.lingering.delete(fl);
      fl.sending = false;
      this.shadows = this.shadows.filter((sh) => sh !== fl);
      return;
    }
    if (fl !== this.cur) return;
    this.cur = undefined;
    this.timer?.cancel();
    this.c.debug("keepalive stream broke", err);
    if (this.closed || this.entries.size === 0) return;
    const healthy = fl.replied;
    // Nothing answered: the addresses left may all be down; try the ones set aside again.
    if (!healthy && this.c.api.several) this.c.api.clearAside();
    if (healthy || this.c.clock.now() - this.openedAt > 10_000) this.attempt = 0;
    // The first reconnect after a stream that worked goes at once: a replica died, another is there.
    if (!healthy || this.attempt > 0) {
      this.reconnect = this.c.clock.setTimer(this.c.backoff(this.attempt), () => {
        this.reconnect = undefined;
        this.open();
      });
    } else {
      this.open();
    }
    this.attempt++;
  }

  /** Leaves fl's replica on purpose (draining or stalled; C2 #ct2-failover); false when there is nowhere else to go. */
  private moveAway(fl: Flight, why: string, draining: boolean): boolean {
    if (!this.c.api.setAside(fl.stream.peer, draining)) return false;
    this.c.debug(`moving to another replica: ${why}`, fl.stream.peer);
    fl.left = true;
    if (!draining) {
      // A stall move keeps sending on the stalled stream until a later stream answers.
      fl.sending = true;
      this.shadows.push(fl);
      if (this.shadows.length > maxShadows) this.stopShadow(this.shadows[0]!);
    }
    this.cur = undefined;
    this.timer?.cancel();
    this.lingering.add(fl);
    this.linger(fl);
    this.attempt = 0;
    this.open();
    return true;
  }

  /** Ends the heartbeats sent on a stalled stream: from now on it is only received on (linger). */
  private stopShadow(fl: Flight): void {
    fl.sending = false;
    this.shadows = this.shadows.filter((sh) => sh !== fl);
    if (this.lingering.has(fl)) this.linger(fl);
  }

  /**
   * A stream left on purpose keeps receiving until every heartbeat it carried
   * is answered or forgotten (a TTL after its send): those answers still
   * extend trust, counted from their own send times. Then it is cut, unless it
   * is still sent heartbeats (a stalled one).
   */
  private linger(fl: Flight): void {
    fl.lingerTimer?.cancel();
    const now = this.c.clock.now();
    let until = 0;
    for (const [id, b] of fl.beats) {
      const at = b.sent + b.s.ttlMs;
      if (now >= at) fl.beats.delete(id);
      else if (at > until) until = at;
    }
    if (until === 0) {
      if (fl.sending) return; // nothing in flight: the next send (schedule) or the end of the sends looks again
      this.lingering.delete(fl);
      fl.stream.cancel();
      return;
    }
    fl.lingerTimer = this.c.clock.setTimer(until - now, () => this.linger(fl));
  }

  /** Sends the heartbeats that are due, forgets old ones, watches for a stall, and arms the next wake-up. */
  private schedule(): void {
    this.timer?.cancel();
    const fl = this.cur;
    if (!fl || this.closed) return;
    const clock = this.c.clock;
    const now = clock.now();
    const due: Entry[] = [];
    let next = now + 3_600_000;
    for (const e of this.entries.values()) {
      // Due within the slack goes now: sending early is always safe.
      if (now + beatSlack(e.s.intervalMs) >= e.next) {
        due.push(e);
        e.next = now + this.jitter(e.s.intervalMs);
      }
      if (e.next < next) next = e.next;
    }
    for (const e of due) {
      const id = ++fl.nextId;
      const { seq, acks } = e.s.beatState(fl.gen);
      fl.beats.set(id, { s: e.s, sent: clock.now(), seq });
      fl.stream.send(create(KeepAliveRequestSchema, { sessionId: e.s.id, sessionSecret: e.s.secret, requestId: id, ack: acks }));
    }
    // The stalled streams still sent heartbeats stop once this stream carried a live answer to a heartbeat (a notice
    // or an error answer does not stop them); until then each gets every due session's heartbeat that has none in
    // flight there, without acknowledgements (C2 #ct2-failover). One unanswered there for a TTL is forgotten first, as
    // on any stream: a replica that answers nothing must not keep a session out of the sends for good.
    if (fl.kept) for (const sh of [...this.shadows]) this.stopShadow(sh);
    for (const sh of this.shadows) {
      const busy = new Set<Session>();
      for (const [id, b] of sh.beats) {
        if (now >= b.sent + b.s.ttlMs) sh.beats.delete(id);
        else busy.add(b.s);
      }
      let sent = false;
      for (const e of due) {
        if (busy.has(e.s)) continue;
        const id = ++sh.nextId;
        sh.beats.set(id, { s: e.s, sent: clock.now(), seq: e.s.beatSeq() });
        sh.stream.send(create(KeepAliveRequestSchema, { sessionId: e.s.id, sessionSecret: e.s.secret, requestId: id }));
        sent = true;
      }
      if (sent && this.lingering.has(sh)) this.linger(sh); // a timer to forget what was sent
    }
    // Forget heartbeats unanswered for a TTL: ignoring a reply is always safe.
    let oldest: number | undefined;
    let stall = 0;
    for (const [id, b] of fl.beats) {
      if (now - b.sent > b.s.ttlMs) {
        fl.beats.delete(id);
        continue;
      }
      if (oldest === undefined || b.sent < oldest) oldest = b.sent;
      const st = stallAfter(b.s.intervalMs);
      if (stall === 0 || st < stall) stall = st;
    }
    if (this.c.api.several && !fl.stallDone && oldest !== undefined) {
      // A stalled stream: a heartbeat without an answer, and nothing at all on the stream, for the stall bound.
      const at = Math.max(oldest, fl.lastRecv) + stall;
      if (now >= at) {
        if (this.moveAway(fl, "keepalive stream stalled", false)) return;
        fl.stallDone = true;
      } else if (at < next) next = at;
    }
    this.timer = clock.setTimer(next - clock.now(), () => this.schedule());
  }

  /** Moves s's next heartbeat to at most `after` ms from now. */
  beatSoon(s: Session, after: number): void {
    const e = this.entries.get(s.id);
    if (!e || e.s !== s) return;
    const soon = this.c.clock.now() + after;
    if (soon < e.next) {
      e.next = soon;
      this.schedule();
    }
  }

  /**
   * After a live answer: the next heartbeat no later than halfway from now to
   * the earliest deadline the session holds (its own or a lock's), and no
   * sooner than beatSlack (C2 #ct2-deadline). Not after an error answer:
   * heartbeats must not multiply while the backend fails.
   */
  private beatBeforeDeadline(s: Session): void {
    if (s.err) return;
    const at = s.earliest();
    this.beatSoon(s, Math.max((at - this.c.clock.now()) / 2, beatSlack(s.intervalMs)));
  }

  /** Applies one answer or notice. */
  private handle(r: KeepAliveResponse, fl: Flight): void {
    let s: Session | undefined;
    let b: Beat | undefined;
    if (r.requestId !== 0n) {
      b = fl.beats.get(r.requestId);
      if (b) {
        fl.beats.delete(r.requestId);
        s = b.s;
      }
    }
    if (!s) {
      b = undefined; // a notice, or an answer to a forgotten request: only its notices count
      s = this.entries.get(r.sessionId)?.s;
    }
    if (s && s.id === r.sessionId) {
      let ack = false;
      for (const l of r.lost) ack = s.lockLost(l, fl.left ? 0 : fl.gen) || ack;
      if (ack && r.live) this.beatSoon(s, 0); // acknowledge at once: the server repeats the notice until then
      if (r.error) {
        // Transient: keep the current deadline and try again soon. A held set still ends the locks it does not list.
        const err = fromCode(r.error.code, r.error.reason, r.error.message);
        this.c.debug("heartbeat failed", err);
        if (err instanceof PermissionDeniedError) {
          s.end(err); // the server refuses this session's secret: no later heartbeat can succeed
        } else if (b) {
          if (r.held) s.answer(b.sent, b.seq, false, 0, r.held);
          this.beatSoon(s, Math.min(s.intervalMs / 2, 1000));
        }
      } else if (!r.live) {
        s.end(new SessionDeadError("session dead: the server reports it not live")); // terminal, whichever request this answers
      } else if (b) {
        fl.kept = true; // a notice or an error answer does not stop the shadows (C2 #ct2-failover)
        s.answer(b.sent, b.seq, true, Number(r.remainingMs), r.held);
        this.beatBeforeDeadline(s);
      }
    }
    if (r.draining && fl.sending) this.stopShadow(fl); // a stalled stream whose replica drains: send nothing more there
    if (r.draining && !fl.drainSeen && !fl.left && fl === this.cur) {
      // The replica drains (C2 #ct2-drain): go elsewhere if there is somewhere else.
      fl.drainSeen = true;
      if (this.c.api.several) this.moveAway(fl, "replica draining", true);
    }
  }

  close(): void {
    this.closed = true;
    this.timer?.cancel();
    this.reconnect?.cancel();
    this.cur?.stream.cancel();
    this.cur = undefined;
    for (const fl of this.lingering) {
      fl.lingerTimer?.cancel();
      fl.stream.cancel();
    }
    this.lingering.clear();
    this.shadows = [];
  }
}
