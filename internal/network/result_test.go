package network

import (
	"encoding/json"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	types100 "github.com/containernetworking/cni/pkg/types/100"
)

func TestParseResult(t *testing.T) {
	tests := []struct {
		name    string
		version string
		json    string
		want    Result
		wantErr string
	}{
		{
			name:    "bridge result",
			version: "1.0.0",
			json: `{"cniVersion":"1.0.0","interfaces":[{"name":"crt0"},{"name":"veth1"},{"name":"eth0","sandbox":"/run/crisp/netns/p"}],
				"ips":[{"interface":2,"address":"10.222.1.2/24","gateway":"10.222.1.1"}]}`,
			want: Result{IP: net.ParseIP("10.222.1.2"), Interface: "eth0", Gateway: net.ParseIP("10.222.1.1")},
		},
		{
			name:    "dual stack, IPv4 preferred even when listed second",
			version: "1.0.0",
			json: `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/p"}],
				"ips":[{"interface":0,"address":"fd00::2/64","gateway":"fd00::1"},{"interface":0,"address":"10.222.1.2/24","gateway":"10.222.1.1"}]}`,
			want: Result{IP: net.ParseIP("10.222.1.2"), AdditionalIPs: []net.IP{net.ParseIP("fd00::2")}, Interface: "eth0", Gateway: net.ParseIP("10.222.1.1")},
		},
		{
			name:    "IPv6 only",
			version: "1.0.0",
			json:    `{"cniVersion":"1.0.0","ips":[{"address":"fd00::2/64"}]}`,
			want:    Result{IP: net.ParseIP("fd00::2"), Interface: "eth0"},
		},
		{
			name:    "host-side address ignored",
			version: "1.0.0",
			json: `{"cniVersion":"1.0.0","interfaces":[{"name":"br0"},{"name":"eth0","sandbox":"/p"}],
				"ips":[{"interface":0,"address":"10.0.0.1/24"},{"interface":1,"address":"10.0.0.5/24"}]}`,
			want: Result{IP: net.ParseIP("10.0.0.5"), Interface: "eth0"},
		},
		{
			name:    "older result version converted",
			version: "0.4.0",
			json:    `{"cniVersion":"0.4.0","interfaces":[{"name":"eth0","sandbox":"/p"}],"ips":[{"version":"4","interface":0,"address":"10.1.0.9/16","gateway":"10.1.0.1"}]}`,
			want:    Result{IP: net.ParseIP("10.1.0.9"), Interface: "eth0", Gateway: net.ParseIP("10.1.0.1")},
		},
		{
			name:    "no address",
			version: "1.0.0",
			json:    `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/p"}]}`,
			wantErr: "no IP address",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var raw types.Result
			var err error
			if tc.version == "0.4.0" {
				raw, err = types040.NewResult([]byte(tc.json))
			} else {
				raw, err = types100.NewResult([]byte(tc.json))
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseResult(raw)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !got.IP.Equal(tc.want.IP) || !got.Gateway.Equal(tc.want.Gateway) || got.Interface != tc.want.Interface ||
				len(got.AdditionalIPs) != len(tc.want.AdditionalIPs) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range got.AdditionalIPs {
				if !got.AdditionalIPs[i].Equal(tc.want.AdditionalIPs[i]) {
					t.Fatalf("additional IPs %v, want %v", got.AdditionalIPs, tc.want.AdditionalIPs)
				}
			}
		})
	}
}

func TestRuntimeConf(t *testing.T) {
	p := Pod{
		ID: "abc", NetNS: "/run/crisp/netns/abc", Name: "web", Namespace: "default", UID: "u-1",
		PortMappings: []PortMapping{
			{HostPort: 8080, ContainerPort: 80, Protocol: "TCP"},
			{HostPort: 0, ContainerPort: 9090, Protocol: "tcp"}, // no host port: not forwarded
			{HostPort: 5353, ContainerPort: 53, Protocol: "udp", HostIP: "127.0.0.1"},
			{HostPort: 7000, ContainerPort: 7000},
		},
		Annotations: map[string]string{"a": "b"},
		CgroupPath:  "/kubepods/pod-u-1",
	}
	rt := runtimeConf(p)
	if rt.ContainerID != "abc" || rt.NetNS != p.NetNS || rt.IfName != "eth0" {
		t.Fatalf("rt = %+v", rt)
	}
	wantArgs := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", "web"}, {"K8S_POD_INFRA_CONTAINER_ID", "abc"}, {"K8S_POD_UID", "u-1"}}
	if !reflect.DeepEqual(rt.Args, wantArgs) {
		t.Errorf("args = %v, want %v", rt.Args, wantArgs)
	}
	// What the portmap plugin reads, byte for byte.
	b, _ := json.Marshal(rt.CapabilityArgs["portMappings"])
	const wantPM = `[{"hostPort":8080,"containerPort":80,"protocol":"tcp"},{"hostPort":5353,"containerPort":53,"protocol":"udp","hostIP":"127.0.0.1"},{"hostPort":7000,"containerPort":7000,"protocol":"tcp"}]`
	if string(b) != wantPM {
		t.Errorf("portMappings = %s, want %s", b, wantPM)
	}
	if !reflect.DeepEqual(rt.CapabilityArgs["io.kubernetes.cri.pod-annotations"], p.Annotations) || rt.CapabilityArgs["cgroupPath"] != p.CgroupPath {
		t.Errorf("capability args = %v", rt.CapabilityArgs)
	}
	if rt := runtimeConf(Pod{ID: "x", NetNS: "/n"}); len(rt.CapabilityArgs) != 0 {
		t.Errorf("empty pod has capability args %v", rt.CapabilityArgs)
	}
}

// testLogger shows the manager's logs with the test's output (with -v or on failure).
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
