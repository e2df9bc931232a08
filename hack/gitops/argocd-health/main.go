// Command argocd-health runs an Argo CD resource health script (Lua) on Kubernetes objects the way
// Argo CD's application controller does (argo-cd util/lua): in github.com/yuin/gopher-lua, the
// interpreter Argo CD embeds, with the standard libraries closed except package, base and table
// (what Argo CD opens for a custom check without useOpenLibs; its restricted os is not needed by
// the checks run here and stays closed), the object as the global `obj` with integers as
// numbers, a one-second deadline, and the returned table read as {status, message}. A status
// outside Argo CD's set becomes Unknown, as there.
//
// Usage: argocd-health SCRIPT.lua < objects.json
// Output: a JSON list, one {"name", "status", "message"} per object, in the input's order.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	lua "github.com/yuin/gopher-lua"

	"dispatch.dev/hack/gitops/internal/objects"
)

type health struct {
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

var known = map[string]bool{
	"Healthy": true, "Progressing": true, "Degraded": true, "Suspended": true, "Missing": true, "Unknown": true,
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: argocd-health SCRIPT.lua < objects.json")
		os.Exit(2)
	}
	script, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "argocd-health:", err)
		os.Exit(2)
	}
	objs, err := objects.Read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "argocd-health:", err)
		os.Exit(2)
	}
	out := make([]health, 0, len(objs))
	for _, obj := range objs {
		h, err := run(string(script), obj)
		if err != nil {
			fmt.Fprintf(os.Stderr, "argocd-health: %s: %v\n", name(obj), err)
			os.Exit(1)
		}
		h.Name = name(obj)
		out = append(out, h)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "argocd-health:", err)
		os.Exit(1)
	}
}

func run(script string, obj map[string]interface{}) (health, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return health{}, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		return health{}, err
	}
	ret, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return health{}, fmt.Errorf("expect table output from Lua script, not %s", l.Get(-1).Type())
	}
	h := health{Status: str(ret.RawGetString("status")), Message: str(ret.RawGetString("message"))}
	if !known[h.Status] {
		return health{Status: "Unknown", Message: "Lua returned an invalid health status"}, nil
	}
	return h, nil
}

func str(v lua.LValue) string {
	if v == lua.LNil {
		return ""
	}
	return v.String()
}

func toLua(l *lua.LState, v interface{}) lua.LValue {
	switch t := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(t)
	case string:
		return lua.LString(t)
	case int64:
		return lua.LNumber(t)
	case float64:
		return lua.LNumber(t)
	case json.Number:
		return lua.LString(t)
	case []interface{}:
		arr := l.CreateTable(len(t), 0)
		for _, item := range t {
			arr.Append(toLua(l, item))
		}
		return arr
	case map[string]interface{}:
		tbl := l.CreateTable(0, len(t))
		for k, item := range t {
			tbl.RawSetH(lua.LString(k), toLua(l, item))
		}
		return tbl
	}
	return lua.LNil
}

func name(obj map[string]interface{}) string {
	if md, ok := obj["metadata"].(map[string]interface{}); ok {
		if n, ok := md["name"].(string); ok {
			return n
		}
	}
	return "?"
}
