// Command otelcol is the OpenTelemetry Collector that tailtrap's tests export to: a real
// collector built from the upstream modules, with only what the tests use in it. Its
// OTLP receiver (gRPC and HTTP, optionally with TLS) is the other end of tailtrap's OTLP
// exporter, and its file exporter writes what arrived as JSON lines for the test to read.
//
// A distribution of our own instead of a downloaded release binary: the machines reach
// only package registries, and the Go module proxy serves these modules pinned by go.sum.
// Build it with tests/otelcol/build.sh, which caches the binary.
package main

import (
	"fmt"
	"os"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

// components lists the factories of this distribution. No processors, connectors or
// extensions: a pipeline from the OTLP receiver straight to the file exporter is all the
// tests need, and every component left out is one less thing that could differ between
// runs.
func components() (otelcol.Factories, error) {
	receivers, err := otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory())
	if err != nil {
		return otelcol.Factories{}, fmt.Errorf("receivers: %w", err)
	}
	exporters, err := otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory())
	if err != nil {
		return otelcol.Factories{}, fmt.Errorf("exporters: %w", err)
	}
	return otelcol.Factories{
		Receivers: receivers,
		Exporters: exporters,
		// The service refuses to start without a factory for its own logs and metrics.
		Telemetry: otelconftelemetry.NewFactory(),
		// Shown by `otelcol components`, so a binary tells which release it holds.
		ReceiverModules: map[component.Type]string{
			otlpreceiver.NewFactory().Type(): "go.opentelemetry.io/collector/receiver/otlpreceiver v0.161.0",
		},
		ExporterModules: map[component.Type]string{
			fileexporter.NewFactory().Type(): "github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter v0.161.0",
		},
	}, nil
}

func main() {
	settings := otelcol.CollectorSettings{
		Factories: components,
		BuildInfo: component.BuildInfo{
			Command:     "otelcol",
			Description: "OpenTelemetry Collector for tailtrap's tests (OTLP receiver, file exporter)",
			Version:     "0.161.0-tailtrap",
		},
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				// --config=FILE (a path without a scheme is a file) and ${NAME} or
				// ${env:NAME} inside it for the environment.
				ProviderFactories: []confmap.ProviderFactory{
					fileprovider.NewFactory(),
					envprovider.NewFactory(),
				},
				DefaultScheme: "env",
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "otelcol: %v\n", err)
		os.Exit(1)
	}
}
