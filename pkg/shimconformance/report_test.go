package shimconformance

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	bootstrap "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"google.golang.org/protobuf/proto"
)

func sampleReport() *Report {
	return &Report{Shim: "/bin/shim", Mode: ModeTask, Version: "1.2.3", Results: []Result{
		{Capability: "bootstrap.params", Status: Pass, Duration: Duration(12 * time.Millisecond)},
		{Capability: "task.oom", Status: Fail, Detail: "exited 0\nwant 137", Duration: Duration(2 * time.Second)},
		{Capability: "sandbox.create", Status: Unsupported, Detail: "task mode", Duration: Duration(time.Microsecond)},
	}}
}

func TestReportText(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteText(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("want header, 3 results and a summary, got %q", b.String())
	}
	for i, want := range []string{"PASS", "FAIL", "N/S"} {
		if f := strings.Fields(lines[i+1]); f[0] != want {
			t.Errorf("line %d: %q, want status %s", i+1, lines[i+1], want)
		}
	}
	if !strings.Contains(lines[2], "exited 0 want 137") || !strings.Contains(lines[2], "2s") {
		t.Errorf("fail line %q: want the detail on one line and the duration", lines[2])
	}
	if !strings.Contains(lines[0], "version 1.2.3") || lines[4] != "# 1 passed, 1 failed, 1 not supported" {
		t.Errorf("header %q / summary %q", lines[0], lines[4])
	}
}

func TestReportJSON(t *testing.T) {
	r := sampleReport()
	var b bytes.Buffer
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	if raw["mode"] != "task" || raw["shim"] != "/bin/shim" || raw["version"] != "1.2.3" {
		t.Errorf("report fields: %v", raw)
	}
	res := raw["results"].([]any)[1].(map[string]any)
	if res["capability"] != "task.oom" || res["status"] != "fail" || res["duration"] != "2s" {
		t.Errorf("result: %v", res)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Results) != 3 || back.Results[1].Duration != Duration(2*time.Second) || back.Results[2].Status != Unsupported {
		t.Errorf("round trip: %+v", back)
	}
	if !back.Failed() {
		t.Error("Failed() false with a failure")
	}
	if got, ok := back.Result("sandbox.create"); !ok || got.Detail != "task mode" {
		t.Errorf("Result: %+v %v", got, ok)
	}
	back.Results = back.Results[:1]
	if back.Failed() {
		t.Error("Failed() true without a failure")
	}
}

func TestCapabilitiesUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range Capabilities() {
		if seen[c] || !strings.Contains(c, ".") {
			t.Errorf("capability %q repeated or not dotted", c)
		}
		seen[c] = true
	}
}

func TestParseOptionsTable(t *testing.T) {
	for _, text := range []string{
		"BinaryName = \"/usr/sbin/runc\"\nRoot = \"/run/r\"\nSystemdCgroup = true",
		`BinaryName = "/usr/sbin/runc", Root = "/run/r", SystemdCgroup = true`,
	} {
		table, err := ParseOptionsTable(text)
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		a, err := RuntimeOptions(table, true)
		if err != nil {
			t.Fatal(err)
		}
		if a.GetTypeUrl() != "containerd.runc.v1.Options" {
			t.Errorf("type %q", a.GetTypeUrl())
		}
		var o runcoptions.Options
		if err := proto.Unmarshal(a.GetValue(), &o); err != nil {
			t.Fatal(err)
		}
		if o.BinaryName != "/usr/sbin/runc" || o.Root != "/run/r" || !o.SystemdCgroup {
			t.Errorf("%q: decoded %+v", text, &o)
		}
	}
	if _, err := ParseOptionsTable(`BinaryName = `); err == nil {
		t.Error("bad TOML accepted")
	}
	if _, err := RuntimeOptions(map[string]any{"NoSuchKey": "x"}, true); err == nil {
		t.Error("unknown key accepted")
	}
	if _, err := RuntimeOptions(map[string]any{"SystemdCgroup": "yes"}, true); err == nil {
		t.Error("string for a bool accepted")
	}
	if a, err := RuntimeOptions(nil, true); a != nil || err != nil {
		t.Errorf("empty table: %v %v", a, err)
	}
	a, err := RuntimeOptions(map[string]any{"type_url": "io.containerd.runsc.v1.options", "ConfigPath": "/etc/runsc.toml"}, false)
	if err != nil {
		t.Fatal(err)
	}
	var o runtimeoptions.Options
	if err := proto.Unmarshal(a.GetValue(), &o); err != nil {
		t.Fatal(err)
	}
	if a.GetTypeUrl() != "runtimeoptions.v1.Options" || o.TypeUrl != "io.containerd.runsc.v1.options" || o.ConfigPath != "/etc/runsc.toml" {
		t.Errorf("%s %+v", a.GetTypeUrl(), &o)
	}
	if !IsRuncShim("/x/containerd-shim-runc-v2") || IsRuncShim("/x/containerd-shim-runsc-v1") {
		t.Error("IsRuncShim")
	}
}

func TestParseStartAnswer(t *testing.T) {
	res, err := proto.Marshal(&bootstrap.BootstrapResult{Version: 3, Address: "unix:///run/s/x", Protocol: "ttrpc"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		out           string
		form, address string
		version       int
	}{
		{string(res), "BootstrapResult", "unix:///run/s/x", 3},
		{"unix:///run/s/y\n", "bare address", "unix:///run/s/y", 2},
		{`{"version":3,"address":"unix:///run/s/z","protocol":"ttrpc"}`, "legacy JSON", "unix:///run/s/z", 3},
		{`{"version":2,"address":"unix:///run/s/z"}`, "legacy JSON", "unix:///run/s/z", 2},
	} {
		got, err := parseStartAnswer([]byte(tc.out))
		if err != nil {
			t.Fatalf("%q: %v", tc.out, err)
		}
		if got.form != tc.form || got.address != tc.address || got.version != tc.version {
			t.Errorf("%q: %+v", tc.out, got)
		}
	}
	for _, bad := range []string{"", "hello", `{"version":3,"address":"x","protocol":"grpc"}`} {
		if _, err := parseStartAnswer([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
