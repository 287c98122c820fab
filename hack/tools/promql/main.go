// Command promql checks lockwarden's alerts and dashboard with Prometheus's
// own PromQL parser, as Prometheus would load them: every expression parses
// (the dashboard's Grafana variables replaced by values Grafana would give
// them), every alert's `for` is a Prometheus duration, and every annotation
// is a valid template naming only labels its alert's expression keeps (an
// alert on `sum by (namespace) (...)` has no $labels.pod). Usage:
//
//	promql -rules config/alerts/prometheusrule.yaml -dashboard config/grafana/lockwarden.json
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"text/template"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"
)

func main() {
	rules := flag.String("rules", "", "a PrometheusRule manifest")
	dashboard := flag.String("dashboard", "", "a Grafana dashboard (JSON)")
	flag.Parse()
	var errs []error
	n := 0
	if *rules != "" {
		k, err := checkRules(*rules)
		n += k
		errs = append(errs, err)
	}
	if *dashboard != "" {
		k, err := checkDashboard(*dashboard)
		n += k
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("%d expressions parsed\n", n)
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func checkRules(file string) (int, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	var pr struct {
		Spec struct {
			Groups []struct {
				Name  string `yaml:"name"`
				Rules []rule `yaml:"rules"`
			} `yaml:"groups"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(data, &pr); err != nil {
		return 0, err
	}
	var errs []error
	n := 0
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			n++
			expr, err := parser.ParseExpr(r.Expr)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", r.Alert, err))
				continue
			}
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					errs = append(errs, fmt.Errorf("%s: for: %w", r.Alert, err))
				}
			}
			if r.Labels["severity"] == "" {
				errs = append(errs, fmt.Errorf("%s has no severity", r.Alert))
			}
			kept := keptLabels(expr)
			for name, text := range r.Annotations {
				// Prometheus defines these before an annotation's text.
				defs := "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"
				if _, err := template.New(name).Funcs(templateFuncs).Parse(defs + text); err != nil {
					errs = append(errs, fmt.Errorf("%s: annotation %s: %w", r.Alert, name, err))
				}
				for _, m := range regexp.MustCompile(`\$labels\.(\w+)`).FindAllStringSubmatch(text, -1) {
					if kept != nil && !slices.Contains(kept, m[1]) {
						errs = append(errs, fmt.Errorf("%s: annotation %s names $labels.%s, which %q does not keep (only %v)", r.Alert, name, m[1], r.Expr, kept))
					}
				}
			}
		}
	}
	return n, errors.Join(errs...)
}

// keptLabels are the labels an expression's result keeps when it
// aggregates `by (...)`, nil when it keeps its series' own labels.
func keptLabels(e parser.Expr) []string {
	switch e := e.(type) {
	case *parser.ParenExpr:
		return keptLabels(e.Expr)
	case *parser.BinaryExpr:
		if _, ok := e.RHS.(*parser.NumberLiteral); ok {
			return keptLabels(e.LHS)
		}
		return nil
	case *parser.AggregateExpr:
		if e.Without {
			return nil
		}
		return e.Grouping
	case *parser.Call:
		if e.Func.Name == "absent" {
			return []string{}
		}
	}
	return nil
}

// templateFuncs are the names of Prometheus's template functions, enough to
// parse an annotation.
var templateFuncs = template.FuncMap{}

func init() {
	for _, name := range []string{"humanize", "humanize1024", "humanizeDuration", "humanizePercentage", "humanizeTimestamp",
		"query", "first", "label", "value", "strvalue", "args", "reReplaceAll", "safeHtml", "match", "title", "toUpper", "toLower",
		"graphLink", "tableLink", "sortByLabel", "stripPort", "stripDomain", "parseDuration", "externalURL", "pathPrefix", "toTime", "urlQueryEscape"} {
		templateFuncs[name] = func(...any) any { return nil }
	}
}

// grafanaVariables are replaced before parsing, as Grafana substitutes
// them.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$__range", "1h")

func checkDashboard(file string) (int, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		return 0, err
	}
	var errs []error
	n := 0
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			n++
			if _, err := parser.ParseExpr(grafanaVariables.Replace(target.Expr)); err != nil {
				errs = append(errs, fmt.Errorf("panel %q: %w", p.Title, err))
			}
		}
	}
	if n == 0 {
		errs = append(errs, errors.New("the dashboard has no expressions"))
	}
	return n, errors.Join(errs...)
}
