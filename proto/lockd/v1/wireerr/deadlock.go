package wireerr

import (
	"encoding/json"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
)

// MetadataKeys is the ErrorInfo metadata key of a DEADLOCK error: the
// cycle's keys as a JSON array of strings (C2 #ct2-deadlock).
const MetadataKeys = "keys"

// DeadlockStatus is the status of a wait refused as a deadlock's victim:
// code Aborted, reason DEADLOCK, the keys in the ErrorInfo metadata.
func DeadlockStatus(keys []string, msg string) *status.Status {
	st := status.New(Code(ReasonDeadlock), msg)
	b, _ := json.Marshal(keys) // a []string always marshals
	info := &errdetails.ErrorInfo{Reason: ReasonDeadlock, Domain: Domain, Metadata: map[string]string{MetadataKeys: string(b)}}
	if withDetails, err := st.WithDetails(info); err == nil {
		st = withDetails
	}
	return st
}

// DeadlockKeys returns the keys named by st's DEADLOCK ErrorInfo; ok is
// false when st is not a DEADLOCK error. Keys that do not decode are nil.
func DeadlockKeys(st *status.Status) (keys []string, ok bool) {
	for _, d := range st.Details() {
		if info, isInfo := d.(*errdetails.ErrorInfo); isInfo && info.Domain == Domain && info.Reason == ReasonDeadlock {
			if json.Unmarshal([]byte(info.GetMetadata()[MetadataKeys]), &keys) != nil {
				keys = nil
			}
			return keys, true
		}
	}
	return nil, false
}
