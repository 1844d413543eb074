package cri

import (
	"testing"
	"time"
)

func TestPhasesAddUpAndObserve(t *testing.T) {
	ph := phases{}
	end := ph.start("a")
	time.Sleep(2 * time.Millisecond)
	end()
	first := ph["a"]
	ph.start("a")()
	ph.start("b")()
	if first < 2*time.Millisecond || ph["a"] < first {
		t.Errorf("a = %v after %v: a phase timed twice must add up", ph["a"], first)
	}
	got := map[string]time.Duration{}
	ph.observe(func(p string, d time.Duration) { got[p] = d })
	if len(got) != 2 || got["a"] != ph["a"] || got["b"] != ph["b"] {
		t.Errorf("observed %v, want %v", got, ph)
	}
}
