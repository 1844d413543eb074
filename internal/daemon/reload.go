package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/image/remote"
	"github.com/crisp-runtime/crisp/internal/image/sigpolicy"
	"github.com/crisp-runtime/crisp/internal/metrics"
)

// remoteConfig builds the image service's registry settings from cfg. Start and
// reload both call it, so that a reload applies exactly what a start with the same
// file would.
func remoteConfig(cfg config.Config) (remote.Config, error) {
	rc := remote.Config{
		Mirrors:                cfg.Registry.Mirrors,
		Insecure:               cfg.Registry.Insecure,
		MaxConcurrentDownloads: cfg.Registry.MaxConcurrentDownloads,
		HostsDir:               cfg.Registry.ConfigPath,
		AuthFile:               cfg.Registry.AuthFile,
		ProgressTimeout:        time.Duration(cfg.Image.PullProgressTimeout),
	}
	// What would fail every pull later fails the start or the reload now: a
	// hosts.toml that does not decode, an auth file that is not a config.json.
	if err := remote.CheckHostsDir(rc.HostsDir); err != nil {
		return rc, err
	}
	if err := remote.CheckAuthFile(rc.AuthFile); err != nil {
		return rc, err
	}
	// The policy file is read here, at start and at each reload only: a file that
	// cannot be loaded fails the start, or makes a reload keep the policy in force.
	if path := cfg.Image.SignaturePolicy; path != "" {
		pol, err := sigpolicy.Load(path)
		if err != nil {
			return rc, fmt.Errorf("image.signature_policy: %w", err)
		}
		rc.Policy = pol
	}
	return rc, nil
}

// parseLevel turns a validated log_level into a slog level; config.Validate has
// refused anything else, which would be info.
func parseLevel(s string) slog.Level {
	var l slog.Level
	_ = l.UnmarshalText([]byte(s))
	return l
}

// imageSettings is what a reload changes in the image service.
type imageSettings interface {
	Reconfigure(rc remote.Config, pinned []string)
}

// reloader applies the config file again when criserver is asked to (SIGHUP): the
// log level, the registry settings and the pinned images; every other key changed in
// the file is named in a warning, as it takes effect at the next start only.
type reloader struct {
	path    string         // empty: criserver runs on the defaults and has no file to read
	level   *slog.LevelVar // nil: the logger's level is fixed
	images  imageSettings
	metrics *metrics.Metrics
	log     *slog.Logger
	// running is the config in force: what was loaded at start, with the reloadable
	// keys of each applied reload. Only the reload goroutine touches it.
	running config.Config
}

// start runs the reload loop in a goroutine of its own until stop is called; stop
// returns once the loop, and any reload it was doing, has ended.
func (r *reloader) start(requests <-chan os.Signal) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case sig := <-requests:
				// The outcome is logged and counted by reload.
				_ = r.reload(sig)
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// reload reads the file and applies it, or refuses it whole: a file that does not
// load, or whose registry settings cannot be built, changes nothing.
func (r *reloader) reload(sig os.Signal) error {
	if r.path == "" {
		r.log.Info("reload requested, but criserver runs without a config file: nothing to reload", "signal", sig.String())
		return nil
	}
	next, err := config.Load(r.path)
	if err == nil {
		var rc remote.Config
		if rc, err = remoteConfig(next); err == nil {
			r.apply(next, rc)
		}
	}
	r.metrics.ConfigReloaded(err)
	if err != nil {
		r.log.Error("config reload refused: the settings in force are unchanged", "signal", sig.String(), "file", r.path, "err", err)
		return fmt.Errorf("reload %s: %w", r.path, err)
	}
	return nil
}

// apply puts next's reloadable settings in force and logs what changed.
func (r *reloader) apply(next config.Config, rc remote.Config) {
	applied := []string{} // logged as [] rather than null when nothing changed
	for _, k := range config.ChangedKeys(r.running, next) {
		if config.Reloadable(k) {
			applied = append(applied, k)
		}
	}
	restart := config.RestartKeys(r.running, next)
	r.images.Reconfigure(rc, next.Image.Pinned)
	if r.level != nil {
		r.level.Set(parseLevel(next.LogLevel))
	}
	r.running = config.Reloaded(r.running, next)
	// The files the config names are read again whether or not their keys changed:
	// say so, since "changed" lists only keys.
	r.log.Info("config reloaded", "file", r.path, "changed", applied, "log_level", next.LogLevel,
		"signature_policy_reloaded", next.Image.SignaturePolicy, "registry_config_path", next.Registry.ConfigPath)
	if len(restart) > 0 {
		r.log.Warn("config keys changed that take effect only when criserver restarts; they keep their running values until then",
			"file", r.path, "keys", restart)
	}
}
