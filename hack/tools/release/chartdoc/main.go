// Command chartdoc writes the chart's README from its values' comments, as
// helm-docs does: each value whose comment starts with "# --" is a row of
// the values table (key, type, default, description), and a map without
// such a comment is documented key by key. A value with no "# --" comment,
// at any depth, is an error: every value the chart takes is documented.
//
//	chartdoc -chart dist/chart            # writes dist/chart/README.md
//	chartdoc -chart dist/chart -check     # fails if README.md is not up to date
//
// The README is README.md.gotmpl with the line "{{ values }}" replaced by
// the table.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"
)

func main() {
	chart := flag.String("chart", "dist/chart", "the chart's directory")
	check := flag.Bool("check", false, "only check that README.md is what it would write")
	flag.Parse()
	if err := run(*chart, *check); err != nil {
		fmt.Fprintln(os.Stderr, "chartdoc:", err)
		os.Exit(1)
	}
}

func run(chart string, check bool) error {
	values, err := os.ReadFile(filepath.Join(chart, "values.yaml"))
	if err != nil {
		return err
	}
	tmpl, err := os.ReadFile(filepath.Join(chart, "README.md.gotmpl"))
	if err != nil {
		return err
	}
	table, err := Table(values)
	if err != nil {
		return err
	}
	readme := strings.Replace(string(tmpl), "{{ values }}\n", table, 1)
	if readme == string(tmpl) {
		return errors.New(`README.md.gotmpl has no "{{ values }}" line`)
	}
	out := filepath.Join(chart, "README.md")
	if check {
		have, err := os.ReadFile(out)
		if err != nil || !bytes.Equal(have, []byte(readme)) {
			return fmt.Errorf("%s is not up to date with values.yaml: run make chart-readme", out)
		}
		return nil
	}
	return os.WriteFile(out, []byte(readme), 0o644)
}

// Row is one documented value.
type Row struct{ Key, Type, Default, Description string }

// Table returns the Markdown table of the values' documented keys, in the
// order values.yaml has them.
func Table(values []byte) (string, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(values, &doc); err != nil {
		return "", err
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return "", errors.New("values.yaml is not a map")
	}
	var rows []Row
	if err := walk(doc.Content[0], "", &rows); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("| Key | Type | Default | Description |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.Key, r.Type, r.Default, r.Description)
	}
	return b.String(), nil
}

func walk(m *yaml.Node, prefix string, rows *[]Row) error {
	for i := 0; i+1 < len(m.Content); i += 2 {
		key, value := m.Content[i], m.Content[i+1]
		path := prefix + key.Value
		desc, documented := description(key.HeadComment)
		switch {
		case documented:
			def, err := defaultOf(value)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			*rows = append(*rows, Row{Key: path, Type: typeOf(value), Default: def, Description: desc})
		case value.Kind == yaml.MappingNode && len(value.Content) > 0:
			if err := walk(value, path+".", rows); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s has no \"# --\" comment: document every value", path)
		}
	}
	return nil
}

// description is the text of a "# -- " comment, and its continuation lines.
func description(comment string) (string, bool) {
	var parts []string
	found := false
	for _, line := range strings.Split(comment, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		if text, ok := strings.CutPrefix(line, "-- "); ok {
			found, parts = true, []string{text}
			continue
		}
		if found && line != "" {
			parts = append(parts, line)
		}
	}
	return strings.ReplaceAll(strings.Join(parts, " "), "|", `\|`), found
}

func typeOf(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "list"
	case yaml.MappingNode:
		return "object"
	}
	switch n.Tag {
	case "!!bool":
		return "bool"
	case "!!int":
		return "int"
	case "!!float":
		return "float"
	}
	return "string"
}

// defaultOf renders the value as compact JSON, in backticks.
func defaultOf(n *yaml.Node) (string, error) {
	var v any
	if err := n.Decode(&v); err != nil {
		return "", err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return "`" + strings.ReplaceAll(strings.TrimSpace(buf.String()), "|", `\|`) + "`", nil
}
