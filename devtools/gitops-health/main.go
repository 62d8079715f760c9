// Command gitops-health tells what two GitOps readers make of a Kubernetes object:
//
//   - kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status, read by Flux, kpt, cli-utils'
//     apply --wait): status.Compute on the object, the library itself;
//   - Argo CD: a resource customization's health.lua run with gopher-lua the way Argo CD's
//     util/lua runs it (argoproj/argo-cd, util/lua/lua.go, VM.runLua + ExecuteHealthLua):
//     no standard libraries but package, base and table, the object as the global `obj`
//     (decoded value by value as its decodeValue does), a one-second deadline, the
//     returned table encoded with layeh.com/gopher-json and read as {status, message},
//     a status outside Argo CD's six codes replaced by Unknown.
//
// Usage:
//
//	gitops-health check --lua DIR/health.lua FILE...   one JSON line per object
//	gitops-health test DIR                             DIR/health_test.yaml, as Argo CD's
//	                                                   TestLuaHealthScript reads it
//
// FILE is a YAML or JSON object ("-": stdin); a List's items are checked one by one.
// `check` prints {"name", "generation", "kstatus": {"status", "message"}, "argocd":
// {"status", "message"}}; `test` prints a line per case and exits 1 if any case's
// result differs from its healthStatus.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	luajson "layeh.com/gopher-json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

// Health is Argo CD's health.HealthStatus as its Lua scripts return it.
type Health struct {
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
}

// Argo CD's health codes (gitops-engine pkg/health); anything else becomes Unknown with
// this message, as ExecuteHealthLua does.
var validHealth = map[string]bool{
	"Unknown": true, "Progressing": true, "Suspended": true,
	"Healthy": true, "Degraded": true, "Missing": true,
}

const invalidHealthStatus = "Lua returned an invalid health status"

func decodeValue(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case json.Number:
		return lua.LString(v)
	case int:
		return lua.LNumber(v)
	case int32:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case []any:
		arr := l.CreateTable(len(v), 0)
		for _, item := range v {
			arr.Append(decodeValue(l, item))
		}
		return arr
	case map[string]any:
		tbl := l.CreateTable(0, len(v))
		for key, item := range v {
			tbl.RawSetH(lua.LString(key), decodeValue(l, item))
		}
		return tbl
	}
	return lua.LNil
}

// ArgoHealth runs script on obj as Argo CD's controller does.
func ArgoHealth(obj *unstructured.Unstructured, script string) (*Health, error) {
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
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true},
			lua.LString(lib.name)); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("actionParams", l.CreateTable(0, 0))
	l.SetGlobal("obj", decodeValue(l, obj.Object))
	if err := l.DoString(script); err != nil {
		return nil, err
	}
	ret := l.Get(-1)
	switch ret.Type() {
	case lua.LTNil:
		return &Health{}, nil
	case lua.LTTable:
	default:
		return nil, fmt.Errorf("expect table output from Lua script, not %s", ret.Type())
	}
	raw, err := luajson.Encode(ret)
	if err != nil {
		return nil, err
	}
	h := &Health{}
	if err := json.Unmarshal(raw, h); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Value == "array" { // an empty table
			return &Health{}, nil
		}
		return nil, err
	}
	if !validHealth[h.Status] {
		return &Health{Status: "Unknown", Message: invalidHealthStatus}, nil
	}
	return h, nil
}

// KStatus is kstatus' verdict on obj.
func KStatus(obj *unstructured.Unstructured) (*Health, error) {
	res, err := status.Compute(obj)
	if err != nil {
		return nil, err
	}
	return &Health{Status: string(res.Status), Message: res.Message}, nil
}

// readObjects reads a YAML or JSON object (a List gives its items) with integers kept as
// int64, as a live object reaches the controller (the JSON decoder of apimachinery).
func readObjects(path string) ([]*unstructured.Unstructured, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, err
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(js); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if !obj.IsList() {
		return []*unstructured.Unstructured{obj}, nil
	}
	list, err := obj.ToList()
	if err != nil {
		return nil, err
	}
	out := make([]*unstructured.Unstructured, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out, nil
}

type verdict struct {
	Name       string  `json:"name"`
	Generation int64   `json:"generation"`
	KStatus    *Health `json:"kstatus"`
	ArgoCD     *Health `json:"argocd"`
}

func check(script string, paths []string) error {
	enc := json.NewEncoder(os.Stdout)
	for _, path := range paths {
		objs, err := readObjects(path)
		if err != nil {
			return err
		}
		for _, obj := range objs {
			k, err := KStatus(obj)
			if err != nil {
				return fmt.Errorf("%s: kstatus: %w", obj.GetName(), err)
			}
			a, err := ArgoHealth(obj, script)
			if err != nil {
				return fmt.Errorf("%s: health.lua: %w", obj.GetName(), err)
			}
			if err := enc.Encode(verdict{obj.GetName(), obj.GetGeneration(), k, a}); err != nil {
				return err
			}
		}
	}
	return nil
}

// argoTests is health_test.yaml as Argo CD's util/lua/health_test.go reads it.
type argoTests struct {
	Tests []struct {
		InputPath    string `json:"inputPath"`
		HealthStatus Health `json:"healthStatus"`
	} `json:"tests"`
}

func runTests(dir string) (bool, error) {
	script, err := os.ReadFile(filepath.Join(dir, "health.lua"))
	if err != nil {
		return false, err
	}
	raw, err := os.ReadFile(filepath.Join(dir, "health_test.yaml"))
	if err != nil {
		return false, err
	}
	var tests argoTests
	if err := yaml.Unmarshal(raw, &tests); err != nil {
		return false, err
	}
	if len(tests.Tests) == 0 {
		return false, errors.New("health_test.yaml lists no test")
	}
	ok := true
	for _, tc := range tests.Tests {
		objs, err := readObjects(filepath.Join(dir, tc.InputPath))
		if err != nil {
			return false, err
		}
		got, err := ArgoHealth(objs[0], string(script))
		if err != nil {
			return false, fmt.Errorf("%s: %w", tc.InputPath, err)
		}
		verdict := "ok"
		if *got != tc.HealthStatus {
			verdict, ok = "FAIL", false
		}
		fmt.Printf("%s %s: got %s %q, want %s %q\n", verdict, tc.InputPath, got.Status,
			got.Message, tc.HealthStatus.Status, tc.HealthStatus.Message)
	}
	return ok, nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gitops-health check --lua FILE OBJECT... | test DIR")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "check":
		fs := flag.NewFlagSet("check", flag.ExitOnError)
		luaPath := fs.String("lua", "", "the health.lua to run")
		_ = fs.Parse(os.Args[2:])
		script, err := os.ReadFile(*luaPath)
		if err == nil {
			err = check(string(script), fs.Args())
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "gitops-health:", err)
			os.Exit(1)
		}
	case "test":
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: gitops-health test DIR")
			os.Exit(2)
		}
		ok, err := runTests(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "gitops-health:", err)
			os.Exit(1)
		}
		if !ok {
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "gitops-health: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}
