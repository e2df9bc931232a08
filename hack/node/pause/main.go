// Command pause is the first process of every pod on the test lab's real node (the pod
// sandbox's "pause" container): it holds the pod's namespaces, reaps the orphans that pod
// processes leave behind, and exits 0 on SIGTERM or SIGINT, which is how the container runtime
// stops a sandbox. No registry is reachable from the lab, so the image is built here
// (hack/build-node.sh) instead of pulled.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (dispatch test lab)")
		return
	}
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0)
	}
}

// reap collects every exited child, so that an orphan re-parented to the sandbox never stays a
// zombie (several SIGCHLDs may arrive as one).
func reap() {
	for {
		pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
