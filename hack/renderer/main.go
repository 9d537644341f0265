// Command cso-renderer renders Helm charts for cso with Helm's own engine, in one long-lived process, so that
// no render starts a `helm` process.
//
// It reads one JSON request per line on stdin and writes one JSON response per line on stdout; requests are
// handled concurrently (a goroutine each) and every response carries its request's id. Two kinds:
//
//   - "render": what `helm template NAME CHART --namespace NS [--include-crds] [--kube-version V]
//     [--api-versions A]... [--values -] [--dry-run=server --kubeconfig K]` prints, byte for byte: the same
//     action (helm.sh/helm/v3/pkg/action Install, as `helm template` configures it: client only, dry run,
//     replace), then the manifest and the hooks joined as cmd/helm/template.go joins them. With a kubeconfig,
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
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/mitchellh/copystructure"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/kube"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
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
		if err := action.CheckDependencies(ch, deps); err != nil {
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

// template runs the Install action as `helm template` sets it up and joins its output as helm prints it.
func (s *server) template(ch *chart.Chart, vals map[string]interface{}, req request) (string, error) {
	cfg := &action.Configuration{Log: func(string, ...interface{}) {}}
	install := action.NewInstall(cfg)
	install.DryRun = true
	install.DryRunOption = "true"
	install.Replace = true
	install.ClientOnly = true
	install.ReleaseName = req.ReleaseName
	install.Namespace = req.Namespace
	install.IncludeCRDs = req.IncludeCRDs
	install.APIVersions = chartutil.VersionSet(req.APIVersions)
	if req.KubeVersion != "" {
		parsed, err := chartutil.ParseKubeVersion(req.KubeVersion)
		if err != nil {
			return "", fmt.Errorf("invalid kube version '%s': %s", req.KubeVersion, err)
		}
		install.KubeVersion = parsed
	}
	if req.Kubeconfig != "" {
		config, err := s.restConfig(req.Kubeconfig, time.Duration(req.TimeoutMS)*time.Millisecond)
		if err != nil {
			return "", err
		}
		install.DryRunOption = "server"
		install.TakeOwnership = true
		cfg.RESTClientGetter = configGetter{config}
	}
	rel, err := install.Run(ch, vals)
	if err != nil {
		if rel != nil {
			return "", fmt.Errorf("%w\n\nUse --debug flag to render out invalid YAML", err)
		}
		return "", err
	}
	var b strings.Builder
	b.WriteString(strings.TrimSpace(rel.Manifest))
	b.WriteString("\n")
	for _, hook := range rel.Hooks {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", hook.Path, hook.Manifest)
	}
	return b.String(), nil
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

// copyChart copies what the Install action changes in a chart (chartutil.ProcessDependencies: the
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
	kubeconfig := path
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &kubeconfig
	flags.WrapConfigFn = func(config *rest.Config) *rest.Config {
		config.Burst = 100
		config.Timeout = timeout
		config.UserAgent = "Helm/" + strings.TrimPrefix(chartutil.DefaultCapabilities.HelmVersion.Version, "v")
		config.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return &kube.RetryingRoundTripper{Wrapped: rt}
		})
		return config
	}
	config, err := flags.ToRESTConfig()
	if err != nil {
		return nil, err
	}
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

// configGetter hands the engine its cluster configuration (`lookup`); a client-only install asks for nothing else.
type configGetter struct{ config *rest.Config }

func (g configGetter) ToRESTConfig() (*rest.Config, error) { return g.config, nil }

func (g configGetter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	return nil, errors.New("cso-renderer: no discovery in a client-only render")
}

func (g configGetter) ToRESTMapper() (meta.RESTMapper, error) {
	return nil, errors.New("cso-renderer: no REST mapper in a client-only render")
}
