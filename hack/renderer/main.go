// Command cso-renderer renders Helm charts for cso with Helm's own engine, in one long-lived process, so that
// no render starts a `helm` process.
//
// It reads one JSON request per line on stdin and writes one JSON response per line on stdout; requests are
// handled concurrently (a goroutine each) and every response carries its request's id. Two kinds:
//
//   - "render": what `helm template NAME CHART --namespace NS [--include-crds] [--kube-version V]
//     [--api-versions A]... [--values -] [--dry-run=server --kubeconfig K]` prints, byte for byte: what that
//     command's client-only, dry-run Install does on this path, done here with Helm's engine and chart
//     packages (see [server.template]), then the manifest and the hooks joined as `helm template` joins them. With a kubeconfig,
//     `lookup` reads that cluster, as `--dry-run=server` does; `.Capabilities` stay the defaults plus
//     kube_version and api_versions there too, as in `helm template` (it stays client only).
//   - "values": cso's values templating (crates/render/src/values.rs): `tpl` of a values file over the
//     Cluster data, through the same one-file helper chart and the same values that ValuesTemplater hands to
//     `helm template`; the answer is what `helm template` prints for it.
//
// Errors are what helm would print on stderr ("Error: ...", with "Use --debug flag ..." where helm adds it).
//
// Loaded charts are kept in memory, keyed by their path and a stamp of their files (sizes and modification
// times); each render works on a copy of the parts Helm changes while it renders (metadata, values,
// dependencies). Kubeconfigs are read once per path and stamp; the most recently used few are kept.
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/mitchellh/copystructure"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/releaseutil"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

type request struct {
	ID   uint64 `json:"id"`
	Kind string `json:"kind"` // "render" (the default) or "values"
	// render
	Chart       string   `json:"chart"`
	ReleaseName string   `json:"release_name"`
	Namespace   string   `json:"namespace"`
	Values      *string  `json:"values"` // YAML, as `--values -` reads it
	KubeVersion string   `json:"kube_version"`
	APIVersions []string `json:"api_versions"`
	IncludeCRDs bool     `json:"include_crds"`
	Kubeconfig  string   `json:"kubeconfig"`
	// values
	Template string          `json:"template"`
	Data     json.RawMessage `json:"data"`
	// both: the most output one answer may carry (0: no limit)
	MaxOutput int `json:"max_output"`
	// a bound for the cluster requests of `lookup` (0: none, as in helm)
	TimeoutMS int64 `json:"timeout_ms"`
}

type response struct {
	ID       uint64 `json:"id"`
	Output   string `json:"output"`
	Error    string `json:"error,omitempty"`
	TooLarge bool   `json:"too_large,omitempty"`
}

// The helper chart of values templating: the same files as crates/render/src/values.rs writes to disk.
const (
	helperChartYAML = "apiVersion: v2\nname: cluster-addon-values\nversion: 0.1.0\n"
	helperTemplate  = "rendered: {{ tpl .Values.template .Values.data | b64enc | quote }}\n"
)

// The most one request line may hold (values are bounded far below this by cso).
const maxRequestBytes = 64 << 20

// gcPercent is the collector's goal unless GOGC says otherwise: the heap may grow by half its live size between
// collections, not double (Go's default). A render leaves mostly garbage behind, so the default's goal is what the
// renderer's resident memory grows to under load; at 1000 Clusters this goal cut its peak by 3-6 MiB for no
// measured CPU (docs/benchmarks.md, session 30), while 25 cost a fifth more CPU for 2 MiB more.
const gcPercent = 50

func main() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(gcPercent)
	}
	helper, err := loader.LoadFiles([]*loader.BufferedFile{
		{Name: "Chart.yaml", Data: []byte(helperChartYAML)},
		{Name: "templates/values.yaml", Data: []byte(helperTemplate)},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "cso-renderer: the values helper chart: %v\n", err)
		os.Exit(2)
	}
	s := &server{charts: map[string]cachedChart{}, configs: map[string]cachedConfig{}, helper: helper}
	out := bufio.NewWriter(os.Stdout)
	var outMu sync.Mutex
	reply := func(r response) {
		outMu.Lock()
		defer outMu.Unlock()
		// One line per answer (Encode ends it with a newline); no HTML escaping, so an answer stays near its size.
		encoder := json.NewEncoder(out)
		encoder.SetEscapeHTML(false)
		if err := encoder.Encode(r); err != nil { // strings only: cannot happen
			fmt.Fprintf(out, "{\"id\":%d,\"output\":\"\",\"error\":\"Error: cso-renderer: unencodable answer\"}\n", r.ID)
		}
		if err := out.Flush(); err != nil {
			os.Exit(1) // cso is gone
		}
	}
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	var wg sync.WaitGroup
	for {
		line, err := readLine(in)
		if len(line) > 0 {
			var req request
			if jerr := json.Unmarshal(line, &req); jerr != nil {
				fmt.Fprintf(os.Stderr, "cso-renderer: unreadable request: %v\n", jerr)
				os.Exit(2)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				reply(s.handle(req))
			}()
		}
		if err != nil {
			break // stdin closed: finish what is running, then exit
		}
	}
	wg.Wait()
}

// readLine reads one line without its newline; a line over maxRequestBytes ends the program.
func readLine(in *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, isPrefix, err := in.ReadLine()
		line = append(line, chunk...)
		if len(line) > maxRequestBytes {
			fmt.Fprintf(os.Stderr, "cso-renderer: a request over %d bytes\n", maxRequestBytes)
			os.Exit(2)
		}
		if err != nil || !isPrefix {
			return line, err
		}
	}
}

type cachedChart struct {
	stamp string
	chart *chart.Chart
}

type cachedConfig struct {
	stamp  string
	config *rest.Config
	used   uint64 // the request count when last handed out: the least recently used goes first
}

// maxCachedConfigs bounds the kubeconfigs kept: each Cluster has one of its own, so an unbounded map grows with
// the Clusters (about 13 KiB of heap each, twice that resident under the collector's goal), while only the
// Clusters being rendered now (cso renders a few at a time) gain from it.
const maxCachedConfigs = 32

type server struct {
	mu      sync.Mutex
	charts  map[string]cachedChart
	configs map[string]cachedConfig
	uses    uint64
	helper  *chart.Chart
}

func (s *server) handle(req request) (resp response) {
	resp.ID = req.ID
	defer func() {
		if p := recover(); p != nil {
			resp = response{ID: req.ID, Error: fmt.Sprintf("Error: cso-renderer: panic: %v", p)}
		}
	}()
	var output string
	var err error
	switch req.Kind {
	case "", "render":
		output, err = s.render(req)
	case "values":
		output, err = s.values(req)
	default:
		err = fmt.Errorf("unknown request kind %q", req.Kind)
	}
	if err != nil {
		resp.Error = "Error: " + err.Error()
		return resp
	}
	if req.MaxOutput > 0 && len(output) > req.MaxOutput {
		resp.TooLarge = true
		return resp
	}
	resp.Output = output
	return resp
}

// render is `helm template` (cmd/helm/template.go and runInstall in cmd/helm/install.go) on a cached chart.
func (s *server) render(req request) (string, error) {
	var vals map[string]interface{}
	if req.Values != nil {
		parsed, err := parseValues([]byte(*req.Values))
		if err != nil {
			return "", err
		}
		vals = parsed
	} else {
		vals = map[string]interface{}{}
	}
	path := strings.TrimSpace(req.Chart)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("path %q not found", path)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	ch, err := s.chart(abs)
	if err != nil {
		return "", err
	}
	switch ch.Metadata.Type {
	case "", "application":
	default:
		return "", fmt.Errorf("%s charts are not installable", ch.Metadata.Type)
	}
	if deps := ch.Metadata.Dependencies; deps != nil {
		if err := checkDependencies(ch, deps); err != nil {
			return "", fmt.Errorf("An error occurred while checking for chart dependencies. You may need to run `helm dependency build` to fetch missing dependencies: %w", err)
		}
	}
	return s.template(ch, vals, req)
}

// values templates one values file as ValuesTemplater does with helm: the helper chart, with its values
// `{"template": ..., "data": ...}` read as `--values -` reads them. The answer is what `helm template` prints for
// it (the `tpl` output, base64-encoded in a map), so that cso reads both backends' answers with one rule.
func (s *server) values(req request) (string, error) {
	data := req.Data
	if len(data) == 0 {
		data = json.RawMessage("null")
	}
	body, err := json.Marshal(map[string]interface{}{"template": req.Template, "data": data})
	if err != nil {
		return "", err
	}
	vals, err := parseValues(body)
	if err != nil {
		return "", err
	}
	return s.template(copyChart(s.helper), vals, request{ReleaseName: "values", Namespace: "default"})
}

// checkDependencies fails, as `helm template` does, when a dependency named in Chart.yaml is not in charts/.
func checkDependencies(ch *chart.Chart, wanted []*chart.Dependency) error {
	present := map[string]bool{}
	for _, d := range ch.Dependencies() {
		present[d.Name()] = true
	}
	var missing []string
	for _, w := range wanted {
		if !present[w.Name] {
			missing = append(missing, w.Name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("found in Chart.yaml, but missing in charts/ directory: %s", strings.Join(missing, ", "))
	}
	return nil
}

// parseValues reads values as `--values -` does (pkg/cli/values: sigs.k8s.io/yaml into a map).
func parseValues(text []byte) (map[string]interface{}, error) {
	vals := map[string]interface{}{}
	if err := yaml.Unmarshal(text, &vals); err != nil {
		return nil, fmt.Errorf("failed to parse -: %w", err)
	}
	if vals == nil {
		vals = map[string]interface{}{}
	}
	return vals, nil
}

// template renders as `helm template` does (a client-only, dry-run Install of helm.sh/helm/v3/pkg/action,
// printed as cmd/helm/template.go prints it), on Helm's engine and chart packages alone: the Install action
// links in release storage, registries and kubectl's resource builders, code (and start-up work) a client-only
// render never runs, which kept the renderer's resident size 5-6 MiB higher. What that Install does on this
// path, in its order: the release name is checked; dependencies are enabled, imported and merged into the
// values; the values are coalesced with the chart's and checked against its schema, over helm's default
// capabilities (with the request's Kubernetes version and extra API versions); the chart's kubeVersion must
// admit that version; the templates are rendered (`lookup` reading the request's cluster, if it names one);
// NOTES.txt files are dropped; the rest are sorted into hooks and manifests in install order; CRDs (when
// asked), then manifests, then hooks are printed, each under "---\n# Source: PATH". Errors from the render on
// carry helm's "Use --debug flag" hint, as `helm template` prints them; earlier ones do not.
func (s *server) template(ch *chart.Chart, vals map[string]interface{}, req request) (string, error) {
	if err := chartutil.ValidateReleaseName(req.ReleaseName); err != nil {
		return "", fmt.Errorf("release name %q: %w", req.ReleaseName, err)
	}
	if err := chartutil.ProcessDependenciesWithMerge(ch, vals); err != nil {
		return "", err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	if req.KubeVersion != "" {
		parsed, err := chartutil.ParseKubeVersion(req.KubeVersion)
		if err != nil {
			return "", fmt.Errorf("invalid kube version '%s': %s", req.KubeVersion, err)
		}
		caps.KubeVersion = *parsed
	}
	caps.APIVersions = append(caps.APIVersions, req.APIVersions...)
	options := chartutil.ReleaseOptions{Name: req.ReleaseName, Namespace: req.Namespace, Revision: 1, IsInstall: true}
	values, err := chartutil.ToRenderValuesWithSchemaValidation(ch, vals, options, caps, false)
	if err != nil {
		return "", err
	}
	manifests, hooks, err := s.renderFiles(ch, values, caps, req)
	if err != nil {
		return "", fmt.Errorf("%w\n\nUse --debug flag to render out invalid YAML", err)
	}
	// The release's manifest (CRDs, then manifests), printed trimmed, then each hook.
	var manifest strings.Builder
	if req.IncludeCRDs {
		for _, crd := range ch.CRDObjects() {
			fmt.Fprintf(&manifest, "---\n# Source: %s\n%s\n", crd.Filename, crd.File.Data)
		}
	}
	for _, m := range manifests {
		fmt.Fprintf(&manifest, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	var out strings.Builder
	out.WriteString(strings.TrimSpace(manifest.String()))
	out.WriteString("\n")
	for _, hook := range hooks {
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", hook.Path, hook.Manifest)
	}
	return out.String(), nil
}

// notesFile is the name of a chart's notes template: rendered like the others, printed by no `helm template`.
const notesFile = "NOTES.txt"

// renderFiles renders the chart's templates and sorts what they give into manifests and hooks, in install order.
func (s *server) renderFiles(ch *chart.Chart, values chartutil.Values, caps *chartutil.Capabilities, req request) ([]releaseutil.Manifest, []*release.Hook, error) {
	if ch.Metadata.KubeVersion != "" && !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, caps.KubeVersion.String()) {
		return nil, nil, fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", ch.Metadata.KubeVersion, caps.KubeVersion.String())
	}
	var render engine.Engine
	if req.Kubeconfig != "" {
		config, err := s.restConfig(req.Kubeconfig, time.Duration(req.TimeoutMS)*time.Millisecond)
		if err != nil {
			return nil, nil, err
		}
		render = engine.New(config)
	}
	files, err := render.Render(ch, values)
	if err != nil {
		return nil, nil, err
	}
	for name := range files {
		if strings.HasSuffix(name, notesFile) {
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return nil, nil, err
	}
	return manifests, hooks, nil
}

// chart is the chart at path, loaded once per stamp; the caller gets a copy it may change.
func (s *server) chart(path string) (*chart.Chart, error) {
	stamp, err := stampOf(path)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	cached, ok := s.charts[path]
	s.mu.Unlock()
	if !ok || cached.stamp != stamp {
		loaded, err := loader.Load(path)
		if err != nil {
			return nil, err
		}
		cached = cachedChart{stamp: stamp, chart: loaded}
		s.mu.Lock()
		s.charts[path] = cached
		s.mu.Unlock()
	}
	return copyChart(cached.chart), nil
}

// stampOf digests the names, sizes and modification times of a chart archive or of every file of a chart
// directory: a chart changed in place gets a new stamp.
func stampOf(path string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00%d\x00%v\n", p, info.Size(), info.ModTime().UnixNano(), info.Mode())
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// copyChart copies what a render changes in a chart (chartutil.ProcessDependencies: the
// dependencies list and their metadata, the values); templates and files are shared, read only.
func copyChart(c *chart.Chart) *chart.Chart {
	out := *c
	if c.Metadata != nil {
		md := *c.Metadata
		md.Dependencies = nil
		for _, d := range c.Metadata.Dependencies {
			if d == nil {
				md.Dependencies = append(md.Dependencies, nil)
				continue
			}
			dep := *d
			dep.Tags = append([]string(nil), d.Tags...)
			if d.ImportValues != nil {
				dep.ImportValues = deepCopy(d.ImportValues).([]interface{})
			}
			md.Dependencies = append(md.Dependencies, &dep)
		}
		out.Metadata = &md
	}
	if c.Values != nil {
		out.Values = deepCopy(c.Values).(map[string]interface{})
	}
	out.SetDependencies()
	for _, d := range c.Dependencies() {
		out.AddDependency(copyChart(d))
	}
	return &out
}

func deepCopy(v interface{}) interface{} {
	copied, err := copystructure.Copy(v)
	if err != nil {
		panic(fmt.Sprintf("copying chart values: %v", err)) // plain YAML data: cannot happen
	}
	return copied
}

// restConfig is the client configuration of a kubeconfig, read once per stamp, set up as helm sets up its own
// (pkg/cli: burst 100, retries on transient errors) and bounded by the request's timeout.
func (s *server) restConfig(path string, timeout time.Duration) (*rest.Config, error) {
	stamp, err := stampOf(path)
	if err != nil {
		return nil, err
	}
	key := path + "\x00" + timeout.String()
	s.mu.Lock()
	cached, ok := s.configs[key]
	if ok && cached.stamp == stamp {
		s.uses++
		cached.used = s.uses
		s.configs[key] = cached
		s.mu.Unlock()
		return cached.config, nil
	}
	s.mu.Unlock()
	loaded := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: path}, &clientcmd.ConfigOverrides{})
	config, err := loaded.ClientConfig()
	if err != nil {
		return nil, err
	}
	config.Burst = 100
	config.Timeout = timeout
	config.UserAgent = "Helm/" + strings.TrimPrefix(chartutil.DefaultCapabilities.HelmVersion.Version, "v")
	config.Wrap(func(rt http.RoundTripper) http.RoundTripper { return retryOnEtcdLeaderChange{rt} })
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, replaced := s.configs[key]; !replaced && len(s.configs) >= maxCachedConfigs {
		oldest := ""
		for k, c := range s.configs {
			if oldest == "" || c.used < s.configs[oldest].used {
				oldest = k
			}
		}
		delete(s.configs, oldest)
	}
	s.uses++
	s.configs[key] = cachedConfig{stamp: stamp, config: config, used: s.uses}
	return config, nil
}

// retryOnEtcdLeaderChange repeats a request once, as helm's clients do, when the API server answers it with a
// server error whose Status message ends in "etcdserver: leader changed" or "raft proposal dropped": etcd lost
// its leader for a moment, and the same request will most likely succeed.
type retryOnEtcdLeaderChange struct{ next http.RoundTripper }

func (r retryOnEtcdLeaderChange) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err != nil || !transientEtcdFailure(resp) {
		return resp, err
	}
	return r.next.RoundTrip(req)
}

// transientEtcdFailure reads a 5xx JSON answer's Status (and puts its body back for the caller).
func transientEtcdFailure(resp *http.Response) bool {
	if resp.StatusCode < 500 || resp.Header.Get("content-type") != "application/json" {
		return false
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return false
	}
	var status struct {
		Message string `json:"message"`
		Code    int    `json:"code"`
	}
	if json.Unmarshal(body, &status) != nil || status.Code < 500 {
		return false
	}
	return strings.HasSuffix(status.Message, "etcdserver: leader changed") ||
		strings.HasSuffix(status.Message, "raft proposal dropped")
}
