// Command k8svalidate reads the output of `helm template` (YAML documents separated by
// `---`) and decodes every object into the Kubernetes API's own Go types, strictly: a
// field the type does not have, a field given twice or a value of the wrong type is an
// error. That is what an API server's strict field validation would reject, checked here
// without a cluster. A few cross-references the types cannot express (the DaemonSet's
// selector against its pod labels, volume mounts against volumes, the monitors' ports)
// are checked too.
//
// On success it prints a JSON array on stdout, one entry per object in input order:
// {"apiVersion", "kind", "name", "object"}, where object is the typed value encoded again,
// so a test reads the rendered DaemonSet or ConfigMap without a YAML parser of its own.
// Errors go to stderr, one line each, and the exit status is 1.
//
// Usage: k8svalidate [FILE]   (standard input without FILE)
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// newObject returns an empty value of the Go type for apiVersion and kind; only the kinds
// the chart renders are known, so a template that starts emitting another kind fails here
// until it is added.
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "monitoring.coreos.com/v1 PodMonitor":
		return &monitoringv1.PodMonitor{}, nil
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, nil
	}
	return nil, fmt.Errorf("unknown kind %q of apiVersion %q", kind, apiVersion)
}

type entry struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	Object     any    `json:"object"`
}

// splitDocuments cuts a YAML stream at lines that are exactly `---` (how helm separates
// its templates), keeping the first line number of each document for messages.
func splitDocuments(r io.Reader) ([]string, []int, error) {
	var docs []string
	var starts []int
	var cur strings.Builder
	start, line := 1, 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line++
		if strings.TrimRight(sc.Text(), " \t") == "---" {
			docs, starts = append(docs, cur.String()), append(starts, start)
			cur.Reset()
			start = line + 1
			continue
		}
		cur.WriteString(sc.Text())
		cur.WriteByte('\n')
	}
	docs, starts = append(docs, cur.String()), append(starts, start)
	return docs, starts, sc.Err()
}

// blank: only comments (helm's `# Source:` lines) and whitespace.
func blank(doc string) bool {
	for _, l := range strings.Split(doc, "\n") {
		t := strings.TrimSpace(l)
		if t != "" && !strings.HasPrefix(t, "#") {
			return false
		}
	}
	return true
}

func source(doc string) string {
	for _, l := range strings.Split(doc, "\n") {
		if s, ok := strings.CutPrefix(strings.TrimSpace(l), "# Source: "); ok {
			return s
		}
	}
	return ""
}

func decode(doc string) (entry, error) {
	// Strict YAML to JSON: a key given twice in one mapping is an error.
	js, err := yaml.YAMLToJSONStrict([]byte(doc))
	if err != nil {
		return entry{}, err
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return entry{}, err
	}
	obj, err := newObject(tm.APIVersion, tm.Kind)
	if err != nil {
		return entry{}, err
	}
	// The decoder the API server uses for strict field validation: case-sensitive field
	// names (encoding/json alone would accept `hostnetwork`), unknown and duplicate fields
	// reported.
	strict, err := sigsjson.UnmarshalStrict(js, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return entry{}, err
	}
	if len(strict) > 0 {
		return entry{}, errors.Join(strict...)
	}
	meta := obj.(metav1.Object)
	if meta.GetName() == "" {
		return entry{}, errors.New("metadata.name is empty")
	}
	if err := check(obj); err != nil {
		return entry{}, err
	}
	return entry{APIVersion: tm.APIVersion, Kind: tm.Kind, Name: meta.GetName(), Object: obj}, nil
}

// check does the cross-field checks the types alone cannot.
func check(obj any) error {
	ds, ok := obj.(*appsv1.DaemonSet)
	if !ok {
		return nil
	}
	var errs []error
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	switch {
	case ds.Spec.Selector == nil:
		errs = append(errs, errors.New("spec.selector is missing"))
	case err != nil:
		errs = append(errs, fmt.Errorf("spec.selector: %w", err))
	case sel.Empty() || !sel.Matches(labels.Set(ds.Spec.Template.Labels)):
		errs = append(errs, errors.New("spec.selector does not select spec.template.metadata.labels"))
	}
	vols := map[string]bool{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		vols[v.Name] = true
	}
	if len(ds.Spec.Template.Spec.Containers) == 0 {
		errs = append(errs, errors.New("no containers"))
	}
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Image == "" {
			errs = append(errs, fmt.Errorf("container %s: no image", c.Name))
		}
		for _, m := range c.VolumeMounts {
			if !vols[m.Name] {
				errs = append(errs, fmt.Errorf("container %s: volumeMount %s names no volume", c.Name, m.Name))
			}
		}
		for _, p := range c.Ports {
			if len(p.Name) > 15 {
				errs = append(errs, fmt.Errorf("container %s: port name %q is longer than 15 characters", c.Name, p.Name))
			}
		}
	}
	return errors.Join(errs...)
}

func main() {
	in := io.Reader(os.Stdin)
	if len(os.Args) > 1 {
		f, err := os.Open(os.Args[1])
		if err != nil {
			fmt.Fprintf(os.Stderr, "k8svalidate: %v\n", err)
			os.Exit(1)
		}
		defer f.Close()
		in = f
	}
	docs, starts, err := splitDocuments(in)
	if err != nil {
		fmt.Fprintf(os.Stderr, "k8svalidate: reading: %v\n", err)
		os.Exit(1)
	}
	out := []entry{}
	failed := false
	for i, doc := range docs {
		if blank(doc) {
			continue
		}
		e, err := decode(doc)
		if err != nil {
			failed = true
			where := fmt.Sprintf("document at line %d", starts[i])
			if s := source(doc); s != "" {
				where += " (" + s + ")"
			}
			for _, l := range strings.Split(err.Error(), "\n") {
				fmt.Fprintf(os.Stderr, "k8svalidate: %s: %s\n", where, l)
			}
			continue
		}
		out = append(out, e)
	}
	if failed {
		os.Exit(1)
	}
	if len(out) == 0 {
		fmt.Fprintln(os.Stderr, "k8svalidate: no objects in the input")
		os.Exit(1)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "k8svalidate: encoding: %v\n", err)
		os.Exit(1)
	}
	os.Stdout.Write(buf.Bytes())
}
