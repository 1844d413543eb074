package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

// spImage is an image pushed for the signature policy test: its reference, its
// manifest digest (what cosign signs) and every blob of its own.
type spImage struct {
	ref      string
	manifest digest.Digest
	id       digest.Digest // the config digest: the image's ID
	blobs    []digest.Digest
}

// spPush pushes img to host as repo:tag.
func spPush(t *testing.T, host, repo, tag string, img v1.Image) spImage {
	t.Helper()
	d := imagetest.Push(t, host, repo+":"+tag, img)
	id := imagetest.ConfigDigest(t, img)
	return spImage{
		ref:      host + "/" + repo + ":" + tag,
		manifest: d,
		id:       id,
		blobs:    append([]digest.Digest{id}, imagetest.LayerDigests(t, img)...),
	}
}

// spBuild returns busybox with a layer and a label of its own, so that the images of
// the test share no manifest, config or top layer.
func spBuild(t *testing.T, name string) v1.Image {
	t.Helper()
	return imagetest.NewImage(t, imagetest.ImageOptions{Config: v1.Config{
		Env:    []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Cmd:    []string{"/bin/sh"},
		Labels: map[string]string{"e2e.sigpolicy": name},
	}},
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.BusyboxEntries(t)...),
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("etc/sigpolicy", name+"\n")))
}

// spContentFiles lists the files under root/images/content (blobs and ingests),
// relative to it.
func (e *env) spContentFiles(t *testing.T) []string {
	t.Helper()
	dir := filepath.Join(e.root, "images", "content")
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("list %s: %v", dir, err)
	}
	slices.Sort(out)
	return out
}

// spWritePolicy replaces the policy file.
func spWritePolicy(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestE2ESignaturePolicy pulls through criserver's CRI under image.signature_policy:
// a cosign signature by the team's key admits an image (which then runs), while an
// unsigned image, one signed with another key and one outside the policy's scopes are
// refused with PermissionDenied naming the scope and requirement, before any of their
// blobs is downloaded or stored. SIGHUP loads an edited policy file, a policy that
// does not load is refused whole and the one in force stays, and criserver does not
// start with such a file.
func TestE2ESignaturePolicy(t *testing.T) {
	e := newEnv(t)
	base := e.enableMetrics()
	var blobGets imagetest.BlobCounter
	host := imagetest.StartRegistry(t, imagetest.WithBlobCounter(&blobGets))
	keyA, keyB := imagetest.NewCosignKey(t), imagetest.NewCosignKey(t)
	keyAPath := imagetest.WriteFile(t, filepath.Join(e.dir, "keys"), "team.pub", keyA.PublicPEM)

	signedImg := imagetest.BusyboxImage(t, imagetest.OCI, imagetest.Gzip)
	signed := spPush(t, host, "team/signed", "v1", signedImg)
	keyA.Sign(t, host, "team/signed", signed.manifest)
	unsigned := spPush(t, host, "team/unsigned", "v1", spBuild(t, "unsigned"))
	forged := spPush(t, host, "team/forged", "v1", spBuild(t, "forged"))
	keyB.Sign(t, host, "team/forged", forged.manifest)
	// Signed with the team's key, but in a repository no scope names: the default
	// applies, whatever the signature.
	other := spPush(t, host, "other/app", "v1", spBuild(t, "other"))
	keyA.Sign(t, host, "other/app", other.manifest)
	open := spPush(t, host, "open/app", "v1", spBuild(t, "open"))

	teamScope := fmt.Sprintf("transports.docker[%q]", host+"/team")
	policyPath := filepath.Join(e.dir, "policy.json")
	strict := fmt.Sprintf(`{
  "default": [{"type": "reject"}],
  "transports": {
    "docker": {
      %q: [{"type": "sigstoreSigned", "keyPath": %q, "signedIdentity": {"type": "matchRepository"}}],
      %q: [{"type": "insecureAcceptAnything"}]
    }
  }
}
`, host+"/team", keyAPath, host+"/open")
	acceptTeam := fmt.Sprintf(`{
  "default": [{"type": "reject"}],
  "transports": {
    "docker": {
      %q: [{"type": "insecureAcceptAnything"}],
      %q: [{"type": "insecureAcceptAnything"}]
    }
  }
}
`, host+"/team", host+"/open")
	spWritePolicy(t, policyPath, strict)
	e.appendConfig(fmt.Sprintf("[image]\nsignature_policy = %q\n", policyPath))
	e.start()
	ctx := ctxT(t)

	pull := func(ref string) (string, error) {
		pctx, cancel := regPullCtx(ctx)
		defer cancel()
		resp, err := e.img.PullImage(pctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}})
		return resp.GetImageRef(), err
	}
	mustPull := func(img spImage, why string) {
		t.Helper()
		id, err := pull(img.ref)
		if err != nil {
			t.Fatalf("pull %s (%s): %v", img.ref, why, err)
		}
		if id != img.id.String() {
			t.Errorf("pull %s: image %s, want %s", img.ref, id, img.id)
		}
	}
	// refused pulls img, which the policy must refuse by the requirement of scope
	// with an error containing all of want, and checks that nothing of it was
	// downloaded, stored or listed.
	refused := func(img spImage, scope string, want ...string) {
		t.Helper()
		present := e.spContentFiles(t)
		gets := blobGets.Counts()
		_, err := pull(img.ref)
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("pull %s: %v, want PermissionDenied", img.ref, err)
		} else {
			msg := status.Convert(err).Message()
			for _, w := range append([]string{img.ref, policyPath, scope + " requires"}, want...) {
				if !strings.Contains(msg, w) {
					t.Errorf("pull %s: %q does not name %q", img.ref, msg, w)
				}
			}
		}
		after := blobGets.Counts()
		for _, b := range img.blobs {
			if after[b] != gets[b] {
				t.Errorf("refused pull of %s downloaded its blob %s", img.ref, b)
			}
		}
		if now := e.spContentFiles(t); !slices.Equal(now, present) {
			t.Errorf("refused pull of %s changed images/content:\nbefore %q\nafter  %q", img.ref, present, now)
		}
		// Its manifest, config and top layer are its own; its busybox layer may be
		// stored already for another image.
		for _, b := range append([]digest.Digest{img.manifest}, img.blobs...) {
			rel := filepath.Join("blobs", b.Algorithm().String(), b.Encoded())
			if slices.Contains(present, rel) {
				continue
			}
			if _, err := os.Stat(filepath.Join(e.root, "images", "content", rel)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("blob %s of the refused %s is stored (stat: %v)", b, img.ref, err)
			}
		}
		e.spNotListed(ctx, t, img)
	}

	// Signed by the team's key: pulled, by tag and by digest, and it runs.
	mustPull(signed, "signed with the team's key")
	byDigest := signed
	byDigest.ref = host + "/team/signed@" + signed.manifest.String()
	mustPull(byDigest, "signed with the team's key, by digest")
	// Where the refusals are checked to store nothing: the admitted image is there.
	if stored := e.spContentFiles(t); !slices.Contains(stored, filepath.Join("blobs", "sha256", signed.id.Encoded())) {
		t.Fatalf("the config of the pulled %s is not under images/content: %q", signed.ref, stored)
	}
	podCfg := e.podConfig("sigpolicy")
	pod := e.runPod(ctx, podCfg)
	ctr := e.runCtr(ctx, pod, podCfg, ctrConfig("signed", signed.ref, "sleep", "3600"))
	_, info := e.status(ctx, pod)
	e.checkPodRuns(ctx, pod, ctr, info.ShimPid)

	refused(unsigned, teamScope, "sigstoreSigned", "no signature found")
	refused(forged, teamScope, "sigstoreSigned", "does not verify with key", keyAPath)
	refused(other, "default", `image rejected by "reject"`)
	mustPull(open, "insecureAcceptAnything for its namespace")
	checkSeries(t, scrape(t, base), map[string]float64{
		`crisp_config_reloads_total{result="success"}`: 0,
		`crisp_config_reloads_total{result="failure"}`: 0,
	})

	// The team's scope now accepts anything: the unsigned image pulls, the pod runs on.
	spWritePolicy(t, policyPath, acceptTeam)
	e.hup()
	recs := e.waitRecords(reloadedMsg, 1)
	t.Logf("reload of the edited policy: changed %v", recs[0]["changed"])
	mustPull(unsigned, "insecureAcceptAnything after the reload")
	e.checkPodRuns(ctx, pod, ctr, info.ShimPid)
	refused(other, "default", `image rejected by "reject"`)
	checkSeries(t, scrape(t, base), map[string]float64{
		`crisp_config_reloads_total{result="success"}`: 1,
		`crisp_config_reloads_total{result="failure"}`: 0,
	})

	// Policies that do not load: each reload is refused, naming the key, and the
	// policy in force stays. The forged image pulls (the strict policy would refuse
	// it) and the other repository is refused by the default reject (the bad files
	// default to accepting anything).
	bad := []struct {
		name, body string
		want       []string
	}{
		{"signedBy", fmt.Sprintf(`{
  "default": [{"type": "insecureAcceptAnything"}],
  "transports": {"docker": {%q: [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": %q}]}}
}
`, host+"/team", keyAPath), []string{teamScope, "signedBy", "not supported"}},
		{"bad JSON", `{"default": [{"type": "insecureAcceptAnything"}], "transports": {"docker": {`, nil},
	}
	for i, b := range bad {
		spWritePolicy(t, policyPath, b.body)
		e.hup()
		recs := e.waitRecords(refusedMsg, i+1)
		msg, _ := recs[i]["err"].(string)
		if recs[i]["level"] != "ERROR" {
			t.Errorf("%s: refusal logged at %v, want ERROR", b.name, recs[i]["level"])
		}
		for _, w := range append([]string{"image.signature_policy", policyPath}, b.want...) {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: refusal %q does not name %q", b.name, msg, w)
			}
		}
		if _, err := e.img.RemoveImage(ctx, &cri.RemoveImageRequest{Image: &cri.ImageSpec{Image: forged.ref}}); err != nil {
			t.Fatalf("RemoveImage %s: %v", forged.ref, err)
		}
		mustPull(forged, "the accepting policy stays after a refused reload of "+b.name)
		refused(other, "default", `image rejected by "reject"`)
		e.checkPodRuns(ctx, pod, ctr, info.ShimPid)
		checkSeries(t, scrape(t, base), map[string]float64{
			`crisp_config_reloads_total{result="success"}`: 1,
			`crisp_config_reloads_total{result="failure"}`: float64(i + 1),
		})
	}
	if n, _ := e.logRecords(reloadedMsg); len(n) != 1 {
		t.Errorf("%d successful reloads logged, want 1", len(n))
	}

	// Back to the strict policy: a pull of the unsigned image, stored by now, is
	// decided by it again; the refusal leaves the stored image alone.
	spWritePolicy(t, policyPath, strict)
	e.hup()
	e.waitRecords(reloadedMsg, 2)
	if _, err := pull(unsigned.ref); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), teamScope) {
		t.Errorf("pull of the stored unsigned %s under the strict policy: %v, want PermissionDenied naming %s", unsigned.ref, err, teamScope)
	}
	if st := e.imageStatus(ctx, unsigned.ref); st.Id != unsigned.id.String() {
		t.Errorf("%s after a refused pull: %s, want %s still stored", unsigned.ref, st.Id, unsigned.id)
	}
	mustPull(signed, "signed, under the strict policy again")
	e.checkPodRuns(ctx, pod, ctr, info.ShimPid)

	// Clean up as kubelet does.
	if _, err := e.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: ctr, Timeout: 1}); err != nil {
		t.Errorf("StopContainer: %v", err)
	}
	if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: ctr}); err != nil {
		t.Errorf("RemoveContainer: %v", err)
	}
	e.stopRemove(ctx, t, pod)
	e.assertPodGone(t, pod, info)

	t.Run("refused-start", func(t *testing.T) {
		for _, c := range []struct {
			name, body string
			want       []string
		}{
			{"signedBy", fmt.Sprintf(`{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": %q}]}`, keyAPath), []string{"default", "signedBy"}},
			{"missing", "", []string{"no such file"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				e := newEnv(t)
				path := filepath.Join(e.dir, "policy.json")
				if c.body != "" {
					spWritePolicy(t, path, c.body)
				}
				e.appendConfig(fmt.Sprintf("[image]\nsignature_policy = %q\n", path))
				out, code := e.spRunFails(t)
				for _, w := range append([]string{"image.signature_policy", path}, c.want...) {
					if !strings.Contains(out, w) {
						t.Errorf("criserver's output does not name %q:\n%s", w, out)
					}
				}
				if code != 1 {
					t.Errorf("criserver exited %d, want 1", code)
				}
				// The policy is loaded before any state is touched.
				for _, p := range []string{e.socket, e.root, e.state} {
					if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("%s exists after the refused start (stat: %v)", p, err)
					}
				}
			})
		}
	})
}

// spNotListed fails if img is in ListImages or ImageStatus.
func (e *env) spNotListed(ctx context.Context, t *testing.T, img spImage) {
	t.Helper()
	st, err := e.img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: img.ref}})
	if err != nil || st.GetImage() != nil {
		t.Errorf("ImageStatus %s after a refused pull: %v %v, want no image", img.ref, st.GetImage(), err)
	}
	list, err := e.img.ListImages(ctx, &cri.ListImagesRequest{})
	if err != nil {
		t.Fatalf("ListImages: %v", err)
	}
	for _, li := range list.Images {
		if li.Id == img.id.String() || slices.Contains(li.RepoTags, img.ref) {
			t.Errorf("ListImages after a refused pull of %s: %v", img.ref, li)
		}
	}
}

// spRunFails runs criserver with the env's config, expecting it to exit on its own,
// and returns its output and exit code.
func (e *env) spRunFails(t *testing.T) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "criserver"), "--config", e.cfgPath)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("criserver still running after 30s with a policy it cannot load:\n%s", out)
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		t.Fatalf("criserver exited 0 with a policy it cannot load:\n%s", out)
	case !errors.As(err, &ee):
		t.Fatalf("run criserver: %v", err)
	}
	return string(out), ee.ExitCode()
}
