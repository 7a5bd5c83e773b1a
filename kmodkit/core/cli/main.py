"""The ``kmodkit`` command."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path

import click

from kmodkit.core.cli.backends import BACKENDS_OPTION, backends, enabled_backends


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """kmodkit: out-of-tree kernel drivers and device firmware on Kubernetes."""


@main.command()
@click.option(
    "--namespace",
    "-n",
    envvar="KMODKIT_NAMESPACE",
    default="kmodkit-system",
    show_default=True,
    help="Namespace the operator runs in and owns objects in.",
)
@click.option(
    "--health-port",
    envvar="KMODKIT_HEALTH_PORT",
    default=8080,
    show_default=True,
    type=int,
    help="Port of the liveness/readiness endpoint (/healthz).",
)
@click.option(
    "--health-host",
    envvar="KMODKIT_HEALTH_HOST",
    default="0.0.0.0",
    show_default=True,
    help="Address the health endpoint listens on.",
)
@BACKENDS_OPTION
@click.option(
    "--metrics-port",
    envvar="KMODKIT_METRICS_PORT",
    default=0,
    show_default=True,
    type=int,
    help="Port of the Prometheus endpoint (/metrics), on the health address; 0 disables it "
    "(the chart serves it on 8081).",
)
@click.option(
    "--lease",
    envvar="KMODKIT_LEASE",
    default="",
    help="Lease (in --namespace) the replicas share, so only one is active at a time; "
    "empty runs a single replica.",
)
def run(
    namespace: str,
    health_port: int,
    health_host: str,
    backends: str,
    metrics_port: int,
    lease: str,
) -> None:
    """Run the operator against the cluster of the current kubeconfig."""
    from kmodkit.core.runtime.operator import run_operator

    raise SystemExit(
        run_operator(
            namespace=namespace,
            health_host=health_host,
            health_port=health_port,
            enabled=enabled_backends(backends),
            lease=lease,
            metrics_port=metrics_port,
        )
    )


@main.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write one file per manifest into; without it, print them all.",
)
@click.option(
    "--chart",
    type=click.Path(file_okay=False, path_type=Path),
    help="A chart directory: CRDs into its crds/, admission policies into a template.",
)
@BACKENDS_OPTION
def crds(out: Path | None, chart: Path | None, backends: str) -> None:
    """Generate the CRDs (and their admission policy) of the Module and the enabled backends."""
    from kmodkit.core.cli.backends import report_failures
    from kmodkit.core.cli.crds import chart_files, generated_documents, generated_files, write_files
    from kmodkit.core.runtime.plugins import discover
    from kmodkit.core.schema.crd import to_yaml

    enabled = enabled_backends(backends)
    report_failures(discover(enabled))
    if out is None and chart is None:
        click.echo(to_yaml(d for docs in generated_documents(enabled).values() for d in docs))
        return
    written = write_files(out, generated_files(enabled)) if out is not None else []
    if chart is not None:
        written += write_files(chart, chart_files(enabled))
    for path in written:
        click.echo(f"wrote {path}", err=True)


class _InvalidInput(click.ClickException):
    """Input kmodkit cannot use; exits 2 like ``validate``."""

    exit_code = 2


_FILE = click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=str)
_NAMESPACE = click.option(
    "--namespace",
    "-n",
    default="default",
    show_default=True,
    help="Namespace assumed for objects that do not name one.",
)


@main.command()
@click.option(
    "-f",
    "--filename",
    "files",
    type=_FILE,
    multiple=True,
    required=True,
    help="YAML file with one or more objects ('-' for stdin); may be repeated.",
)
@_NAMESPACE
def validate(files: tuple[str, ...], namespace: str) -> None:
    """Check Modules offline, with the admission rules and those only kmodkit checks.

    Prints one line per problem and exits 2 if there is any; exits 0 when every
    object is valid.
    """
    from kmodkit.core.cli.support import build_registry, load_objects, object_label

    registry = build_registry()
    failed = False
    for filename in files:
        for index, obj in load_objects(filename, namespace):
            problems = registry.validate(obj)
            label = object_label(obj, index)
            for problem in problems:
                where = f"{problem.path}: " if problem.path else ""
                click.echo(f"{filename}: {label}: {where}{problem.message}")
            if problems:
                failed = True
            else:
                click.echo(f"{filename}: {label}: valid", err=True)
    raise SystemExit(2 if failed else 0)


@main.command()
@click.option(
    "-f",
    "--filename",
    "file",
    type=_FILE,
    required=True,
    help="YAML file holding the Module ('-' for stdin).",
)
@click.option(
    "--kernel",
    "kernels",
    multiple=True,
    required=True,
    help="A kernel as nodes report it (status.nodeInfo.kernelVersion); repeatable.",
)
@click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@_NAMESPACE
def preflight(file: str, kernels: tuple[str, ...], output: str, namespace: str) -> None:
    """Show which mapping, image and build a Module gives each kernel.

    Exits 0 when every kernel matched a mapping and resolved cleanly, 1 when
    some did not, and 2 when the Module itself is invalid.
    """
    from kmodkit.core.cli.preflight import preflight as run_preflight
    from kmodkit.core.cli.support import load_module, print_preflight_table

    module = load_module(file, namespace)
    results = run_preflight(module, kernels)
    if output == "json":
        click.echo(json.dumps([result.to_json() for result in results], indent=2))
    else:
        print_preflight_table(module, results)
    raise SystemExit(0 if all(result.ok for result in results) else 1)


@main.command()
@click.option(
    "-f",
    "--filename",
    "file",
    type=_FILE,
    required=True,
    help="YAML file with the resource(s) to render ('-' for stdin).",
)
@click.option(
    "--nodes",
    "nodes_file",
    type=_FILE,
    help="YAML file with the Node objects to plan for (a List or documents).",
)
@click.option(
    "--images-missing",
    is_flag=True,
    help="Take every Module image as missing, to show the build Jobs instead.",
)
@click.option(
    "--operator-namespace",
    default="kmodkit-system",
    show_default=True,
    help="Namespace the operator would create backend objects in.",
)
@click.option(
    "-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True
)
@_NAMESPACE
def render(
    file: str,
    nodes_file: str | None,
    images_missing: bool,
    operator_namespace: str,
    output: str,
    namespace: str,
) -> None:
    """Print the objects the operator would create for a resource, given those nodes.

    Needs no cluster. JSON output is a list; YAML output is one document per object.
    """
    import yaml

    from kmodkit.core.cli.render import RenderError, nodes_from
    from kmodkit.core.cli.render import render as render_objects
    from kmodkit.core.cli.support import load_objects

    try:
        nodes = (
            nodes_from(obj for _, obj in load_objects(nodes_file, namespace)) if nodes_file else []
        )
        objects = [
            o
            for _, obj in load_objects(file, namespace)
            for o in render_objects(obj, nodes, operator_namespace, images_missing)
        ]
    except (RenderError, ValueError) as err:
        raise _InvalidInput(str(err)) from err
    if output == "json":
        click.echo(json.dumps(objects, indent=2))
    else:
        click.echo(yaml.safe_dump_all(objects, sort_keys=False), nl=False)


main.add_command(backends)


def _add_backend_commands() -> None:
    # Backends bring their own subcommands through the contract, so the CLI
    # never imports a backend by name; a backend that fails to load adds none.
    from kmodkit.core.runtime.plugins import discover

    for found in discover():
        for command in found.backend.commands if found.backend else ():
            main.add_command(command)


_add_backend_commands()


COMMANDS_ENTRY_POINT_GROUP = "kmodkit.commands"


def _add_installed_commands() -> None:
    # Other distributions (the dev harness, a vendor's tools) add subcommands
    # through an entry point, so the product never imports them by name.
    for ep in entry_points(group=COMMANDS_ENTRY_POINT_GROUP):
        try:
            command = ep.load()
        except Exception as e:  # one broken add-on must not take the CLI down
            click.echo(f"kmodkit: skipped command {ep.name!r} ({ep.value}): {e}", err=True)
            continue
        main.add_command(command, ep.name)


_add_installed_commands()
