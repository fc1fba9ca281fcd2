// The error mapping (src/errors.ts): DEADLOCK travels with ABORTED, which
// the SDK retries without a reason; DEADLOCK itself never is (C2
// #ct2-deadlock).
import { test } from "node:test";
import assert from "node:assert/strict";
import { DeadlockError, fromCode, retryable, UnavailableError } from "../../src/errors.js";

test("DEADLOCK is a DeadlockError with the keys and is not retried", () => {
  const e = fromCode(10, "DEADLOCK", "deadlock", { reason: "DEADLOCK", metadata: { keys: '["a","b"]' } });
  assert.ok(e instanceof DeadlockError);
  assert.deepEqual((e as DeadlockError).keys, ["a", "b"]);
  assert.equal(retryable(e), false);
  const plain = fromCode(10, "", "aborted");
  assert.ok(plain instanceof UnavailableError);
  assert.equal(retryable(plain), true);
});
