// Package objects reads Kubernetes objects as the API machinery decodes them: integers become
// int64 (k8s.io/apimachinery/pkg/util/json), as in the objects the tools get from a watch, so
// kstatus' generation checks and Argo CD's Lua conversion see what they see in production.
package objects

import (
	"fmt"
	"io"

	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// Read accepts one object, a JSON list of objects, or a Kubernetes List ({"kind", "items"}).
func Read(r io.Reader) ([]map[string]interface{}, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	var v interface{}
	if err := utiljson.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("stdin is not JSON: %w", err)
	}
	var items []interface{}
	switch t := v.(type) {
	case []interface{}:
		items = t
	case map[string]interface{}:
		if list, ok := t["items"].([]interface{}); ok && t["kind"] != nil {
			items = list
		} else {
			items = []interface{}{t}
		}
	default:
		return nil, fmt.Errorf("stdin is neither a JSON object nor a list of objects")
	}
	out := make([]map[string]interface{}, 0, len(items))
	for i, item := range items {
		obj, ok := item.(map[string]interface{})
		if !ok {
			return nil, fmt.Errorf("item %d: not an object", i)
		}
		out = append(out, obj)
	}
	return out, nil
}
