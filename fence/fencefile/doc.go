// Package fencefile is the lockd fence for files (C2 #ct2-fence-kit).
//
// Write replaces a local file only if the fencing token it is given is at
// or above the highest token that wrote the file before; the mark lives in
// a sidecar file, path + ".fence", read and raised under an exclusive
// flock of that sidecar, and the data goes to a temporary file that is
// synced and renamed over path. The mark is raised before the data is
// renamed, so a crash in between loses the write but never lets an older
// token in afterwards. Every writer of the file must go through Write (or
// take the same lock). Unix only.
//
// Object stores have no flock; the same rule is kept with the store's own
// preconditions (README "Fencing"): keep the token in the object's
// metadata, read the object's generation (GCS) or ETag (S3, Azure), refuse
// locally if your token is below the stored one, and write with
// ifGenerationMatch / If-Match set to what you read; on a failed
// precondition read again and re-apply the rule.
package fencefile
