// The replica choice both transports share (C2 #ct2-failover): the address
// calls go to, the replicas set aside for a while (a drain or a stall), and
// the unary calls in flight by address, which move with the client when
// their replica is set aside. GrpcApi (rpc.ts) and HttpApi (http.ts) each
// hold one.
import { UnavailableError } from "./errors.js";

/** How long a replica set aside is avoided (C2 #ct2-failover). */
export const ASIDE_MS = 30_000;

/** The addresses of one client, the one in use, and those set aside. */
export class Replicas {
  private current = 0;
  private readonly aside = new Map<string, number>(); // address → until
  /** The unary calls in flight, by address: a replica set aside has its calls moved (setAside). */
  private readonly inflight = new Map<string, Set<() => void>>();

  constructor(private readonly addresses: string[], private readonly now: () => number) {}

  /** Whether there are several addresses (failover applies). */
  get several(): boolean {
    return this.addresses.length > 1;
  }

  /** The address calls go to now: the current one, unless it is set aside. */
  pick(): string {
    const n = this.addresses.length;
    const now = this.now();
    for (let i = 0; i < n; i++) {
      const a = this.addresses[(this.current + i) % n]!;
      const until = this.aside.get(a);
      if (until === undefined || until <= now) {
        this.aside.delete(a);
        this.current = (this.current + i) % n;
        return a;
      }
    }
    // Every address set aside: forget the asides and use the current one.
    this.aside.clear();
    return this.addresses[this.current % n]!;
  }

  /** A call to addr failed as if the replica were gone: the next call tries the next address (pick_first's move). */
  failed(addr: string): void {
    const n = this.addresses.length;
    if (n > 1 && this.addresses[this.current % n] === addr) this.current = (this.current + 1) % n;
  }

  /**
   * Sets the replica at `peer` aside (it drains or stalled) so that the next
   * call goes elsewhere; false when there is nowhere else to go (one address,
   * or, for a stall, every other address already set aside).
   */
  setAside(peer: string, draining: boolean): boolean {
    const others = this.addresses.filter((a) => a !== peer);
    if (others.length === 0) return false;
    const now = this.now();
    if (others.every((a) => (this.aside.get(a) ?? 0) > now)) {
      if (!draining) return false; // a stall with every other replica aside: stay
      this.aside.clear(); // a drain: the others are likely back (C2 #ct2-failover)
    }
    this.aside.set(peer, now + ASIDE_MS);
    this.failed(peer);
    // The calls waiting there move with the client (as gRPC's pick_first
    // drops a connection whose address is gone): cancelled here, they fail
    // retryable and are sent again to the replica in use — a waiting
    // Acquire resumes its kept place there (C2 #ct2-keep-place) instead of
    // being cut, and its place left, when the draining replica stops.
    for (const move of this.inflight.get(peer) ?? []) move();
    return true;
  }

  /** Lets the replicas set aside be tried again (nothing answered). */
  clearAside(): void {
    this.aside.clear();
  }

  /**
   * Registers a unary call in flight to addr: `move` cancels it when addr is
   * set aside. Returns what to call when the call is over.
   */
  track(addr: string, move: () => void): () => void {
    let calls = this.inflight.get(addr);
    if (!calls) this.inflight.set(addr, (calls = new Set()));
    calls.add(move);
    return () => calls.delete(move);
  }

  /**
   * What an UNAVAILABLE answer from addr does to the choice: SHUTTING_DOWN
   * sets the replica aside, one without a reason (the connection, not the
   * backend) moves on to the next address. Other errors change nothing.
   */
  answered(addr: string, err: unknown): void {
    if (!(err instanceof UnavailableError)) return;
    if (err.reason === "SHUTTING_DOWN") this.setAside(addr, true);
    else if (err.reason === "") this.failed(addr);
  }
}
