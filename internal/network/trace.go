package network

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/crisp-runtime/crisp/internal/tracing"
)

// Span names of the package: one span per CNI operation of a pod, a child per plugin
// run, and the work crisp itself does around them.
const (
	spanAdd        = "cni.add"
	spanDel        = "cni.del"
	spanPlugin     = "cni.plugin"
	spanMasq       = "cni.masquerade"
	spanMasqFamily = "cni.masquerade.reconcile"
	spanStandIn    = "cni.standin"
	spanIPAMFree   = "cni.ipam.release"
)

// Attribute keys. Kubernetes names use OpenTelemetry's semantic conventions; the rest
// has no convention and is crisp's own.
const (
	attrSandboxID    = tracing.AttrSandboxID
	attrPodName      = tracing.AttrPodName
	attrPodNamespace = tracing.AttrPodNamespace
	attrPodUID       = tracing.AttrPodUID
	attrNetwork      = attribute.Key("crisp.cni.network")
	attrNetNS        = attribute.Key("crisp.cni.netns")
	attrPlugins      = attribute.Key("crisp.cni.plugins")
	attrPortMappings = attribute.Key("crisp.cni.port_mappings")
	attrPodIP        = attribute.Key("crisp.cni.ip")
	attrPluginType   = attribute.Key("crisp.cni.plugin.type")
	attrCommand      = attribute.Key("crisp.cni.command")
	attrResultIPs    = attribute.Key("crisp.cni.result.ips")
	attrResultIfs    = attribute.Key("crisp.cni.result.interfaces")
	attrErrorCode    = attribute.Key("crisp.cni.error.code")
	attrSubnets      = attribute.Key("crisp.cni.masquerade.subnets")
	attrBinary       = attribute.Key("crisp.iptables.binary")
	attrAddrs        = attribute.Key("crisp.cni.standin.addresses")
	attrStore        = attribute.Key("crisp.cni.ipam.store")
	attrReleased     = attribute.Key("crisp.cni.ipam.released")
)

// startOp starts the span of one CNI operation (ADD, DEL) of list for a pod. The
// attributes are built only for a recording span: an untraced pod pays a context
// lookup.
func startOp(ctx context.Context, name string, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (context.Context, trace.Span) {
	ctx, span := tracing.Start(ctx, name)
	if span.IsRecording() {
		span.SetAttributes(attrSandboxID.String(rt.ContainerID), attrNetNS.String(rt.NetNS),
			attrNetwork.String(list.Name), attrPlugins.Int(len(list.Plugins)))
	}
	return ctx, span
}

// setPodAttrs records who the pod of an ADD is.
func setPodAttrs(span trace.Span, p Pod) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attrSandboxID.String(p.ID), attrNetNS.String(p.NetNS), attrPodName.String(p.Name),
		attrPodNamespace.String(p.Namespace), attrPodUID.String(p.UID), attrPortMappings.Int(len(portMappings(p.PortMappings))))
}

// setPluginAttrs records what one plugin run did: its type and command, for an ADD
// how many interfaces and addresses its result has, for a failure the CNI error code. Called for a recording span only: it parses the plugin's output.
func setPluginAttrs(span trace.Span, path string, environ []string, stdout []byte, err error) {
	cmd := envValue(environ, "CNI_COMMAND")
	span.SetAttributes(attrPluginType.String(filepath.Base(path)), attrCommand.String(cmd))
	if err != nil {
		var cniErr *types.Error
		if errors.As(err, &cniErr) && cniErr.Code != 0 {
			span.SetAttributes(attrErrorCode.Int(int(cniErr.Code)))
		}
		return
	}
	if cmd != "ADD" {
		return
	}
	// Counts, not the addresses: the pod's own address is on cni.add.
	var res struct {
		Interfaces []json.RawMessage `json:"interfaces"`
		IPs        []json.RawMessage `json:"ips"`
	}
	if json.Unmarshal(stdout, &res) == nil {
		span.SetAttributes(attrResultIfs.Int(len(res.Interfaces)), attrResultIPs.Int(len(res.IPs)))
	}
}
