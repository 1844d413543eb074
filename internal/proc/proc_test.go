package proc

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		wantState byte
		wantStart uint64
		wantExit  bool
		wantErr   bool
	}{
		{
			name:      "plain",
			in:        "1234 (sleep) S 1 1234 1234 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 18446744073709551615",
			wantState: 'S', wantStart: 987654,
		},
		{
			name:      "comm with spaces and parens",
			in:        "42 (a) b) (c) Z 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0 0",
			wantState: 'Z', wantStart: 55, wantExit: true,
		},
		{
			name:      "in exit (PF_EXITING)",
			in:        "7 (pause) S 1 7 7 0 -1 4194308 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0 0",
			wantState: 'S', wantStart: 99, wantExit: true,
		},
		{name: "bad flags", in: "1 (x) S 1 1 1 0 -1 nope 0 0 0 0 0 0 0 0 20 0 1 0 5 0", wantErr: true},
		{name: "truncated", in: "42 (x) S 1 2 3", wantErr: true},
		{name: "no comm", in: "garbage", wantErr: true},
		{name: "bad starttime", in: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 nope 0", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := ParseStat([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && (st.State != tt.wantState || st.StartTime != tt.wantStart || st.Exiting() != tt.wantExit) {
				t.Fatalf("got %+v (exiting %v), want state %c start %d exiting %v", st, st.Exiting(), tt.wantState, tt.wantStart, tt.wantExit)
			}
		})
	}
}

func TestAliveSelf(t *testing.T) {
	st, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := Alive(os.Getpid(), st.StartTime); err != nil || !ok {
		t.Fatalf("Alive(self) = %v, %v", ok, err)
	}
	if ok, _ := Alive(os.Getpid(), st.StartTime+1); ok {
		t.Fatal("a different start time must not count as the same process")
	}
	if ok, err := Alive(1<<22+1, 0); err != nil || ok {
		t.Fatalf("Alive(nonexistent) = %v, %v", ok, err)
	}
}

func TestClampOOMScoreAdj(t *testing.T) {
	tests := []struct {
		want, floor, got int
		clamped          bool
	}{
		{-998, 0, 0, true},
		{500, 0, 500, false},
		{-500, -999, -500, false},
		{0, 0, 0, false},
	}
	for _, tt := range tests {
		got, clamped := ClampOOMScoreAdj(tt.want, tt.floor)
		if got != tt.got || clamped != tt.clamped {
			t.Errorf("ClampOOMScoreAdj(%d, %d) = %d, %v; want %d, %v", tt.want, tt.floor, got, clamped, tt.got, tt.clamped)
		}
	}
}

func TestKillVerified(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	st, err := ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if killed, err := KillVerified(cmd.Process.Pid, st.StartTime+1, time.Second); killed || err != nil {
		t.Fatalf("KillVerified with a wrong start time = %v, %v; must not kill", killed, err)
	}
	if killed, err := KillVerified(cmd.Process.Pid, st.StartTime, 5*time.Second); !killed || err != nil {
		t.Fatalf("KillVerified = %v, %v", killed, err)
	}
	if err := cmd.Wait(); err == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("sleep did not die of SIGKILL: %v", err)
	}
	if killed, err := KillVerified(cmd.Process.Pid, st.StartTime, time.Second); killed || err != nil {
		t.Fatalf("KillVerified of a reaped process = %v, %v", killed, err)
	}
}
