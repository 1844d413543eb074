package shim

import (
	"slices"
	"strings"
	"testing"
)

func TestEnviron(t *testing.T) {
	env := Environ([]string{"PATH=/bin", "GOMAXPROCS=2", "_CRISP_PAUSE=1", "TTRPC_ADDRESS=/old"})
	slices.Sort(env)
	want := []string{"CRIU_FAULT=130", "GOMAXPROCS=1", "PATH=/bin", "TTRPC_ADDRESS=/old"}
	if !slices.Equal(env, want) {
		t.Fatalf("env = %v, want %v", env, want)
	}
	// An operator's CRIU_FAULT is kept (CRIU_FAULT=0: hardware breakpoints).
	env = Environ([]string{"CRIU_FAULT=0"})
	if !slices.Contains(env, "CRIU_FAULT=0") || slices.Contains(env, "CRIU_FAULT=130") {
		t.Fatalf("env = %v: an operator's CRIU_FAULT=0 must be kept", env)
	}
	for _, kv := range Environ([]string{"GOMAXPROCS=4"}) {
		if strings.HasPrefix(kv, "GOMAXPROCS=") && kv != "GOMAXPROCS=1" {
			t.Fatalf("env keeps %s", kv)
		}
	}
}
