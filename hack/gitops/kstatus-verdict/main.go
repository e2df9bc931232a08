// Command kstatus-verdict prints what Flux concludes about Kubernetes objects: the status that
// sigs.k8s.io/cli-utils/pkg/kstatus computes, the library Flux's Kustomization health checks
// (and kpt, and cli-utils' own apply) use. Nothing here interprets conditions itself.
//
// Input on stdin: one JSON object or a JSON list of objects (e.g. `kubectl get -o json` items).
// Output on stdout: a JSON list, one {"name", "status", "message", "conditions"} per object, in
// the input's order. status is kstatus' InProgress | Failed | Current | Terminating | Unknown.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"

	"dispatch.dev/hack/gitops/internal/objects"
)

type verdict struct {
	Name       string   `json:"name"`
	Status     string   `json:"status"`
	Message    string   `json:"message"`
	Conditions []string `json:"conditions"`
}

func main() {
	objs, err := objects.Read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus-verdict:", err)
		os.Exit(2)
	}
	out := make([]verdict, 0, len(objs))
	for _, obj := range objs {
		u := &unstructured.Unstructured{Object: obj}
		res, err := status.Compute(u)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kstatus-verdict: %s: %v\n", u.GetName(), err)
			os.Exit(1)
		}
		v := verdict{Name: u.GetName(), Status: res.Status.String(), Message: res.Message, Conditions: []string{}}
		for _, c := range res.Conditions {
			v.Conditions = append(v.Conditions, fmt.Sprintf("%s=%s", c.Type, c.Status))
		}
		out = append(out, v)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus-verdict:", err)
		os.Exit(1)
	}
}
