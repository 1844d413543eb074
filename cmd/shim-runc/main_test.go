package main

import "testing"

func TestRunRejectsBadInvocations(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"unknown action", []string{"-id", "x", "frobnicate"}, 1},
		{"unknown flag", []string{"-no-such-flag"}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := run(tt.args); got != tt.want {
				t.Fatalf("run(%q) = %d, want %d", tt.args, got, tt.want)
			}
		})
	}
}
