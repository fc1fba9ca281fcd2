package fencehttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"lock.dev/lockd/fence"
	"lock.dev/lockd/fence/fencehttp"
)

// The middleware in front of a handler: the holder's token passes, a newer
// holder's passes, the superseded holder's is 409 and never reaches the
// handler.
func ExampleMiddleware() {
	store := fence.NewMemoryStore() // fencepg.NewStore(pool) to share marks
	h := fencehttp.Middleware(fencehttp.Options{Store: store})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("write accepted")
	}))
	put := func(token string) {
		req := httptest.NewRequest("PUT", "/report", nil)
		req.Header.Set(fencehttp.HeaderKey, "jobs/report")
		req.Header.Set(fencehttp.HeaderToken, token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			fmt.Print(rec.Code, " ", rec.Body.String())
		}
	}
	put("1764929812345678") // the first holder
	put("1764929812345990") // the next holder
	put("1764929812345678") // the first holder again, after a pause
	// Output:
	// write accepted
	// write accepted
	// 409 {"error":"stale_token","high_water":"1764929812345990","key":"jobs/report","message":"a newer holder of the lock has written: this token is stale","token":"1764929812345678"}
}
