// Command web serves one static page and answers /healthz, for the test environment's real nodes. It is what the
// workload clusters run where a stack's addon asks for nginx (which cannot be built here): an admission policy of
// the environment puts this image, cso.test/web, in such pods, so the pods run and can be judged, and nobody is
// told they run nginx.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"
)

func main() {
	address := os.Getenv("WEB_ADDRESS")
	if address == "" {
		address = ":8080"
	}
	host, _ := os.Hostname()
	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "cso.test/web on %s: the cso test environment's stand-in for a stack's nginx\n", host)
	})
	log.Printf("cso.test/web listening on %s", address)
	log.Fatal(http.ListenAndServe(address, nil))
}
