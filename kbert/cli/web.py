"""The `kbert serve-web` command: the page `kbert export` writes, served from 127.0.0.1.

    kbert serve-web saved_models/debian

It prints one JSON line (the page's address) and serves until Ctrl-C; a line
per request goes to stderr. The page and the server are `kbert.export.web`'s.
"""

import argparse

from kbert.cliargs import add_command
from kbert.cliio import print_json


def add_serve_web_parser(subparsers):
    """Adds the `serve-web` subcommand to an `argparse` subparsers object."""
    from kbert.export.web import DEFAULT_PORT, HOST

    p = add_command(
        subparsers, "serve-web",
        "serve an export's web page (OUT/web/), which runs its MediaPipe file in the browser",
        ["kbert serve-web saved_models/debian", "kbert serve-web saved_models/debian --port 0"],
        description=(
            f"Serves the export folder DIR from {HOST} (this machine only) so that a browser "
            "opens DIR/web/: type a text, see the labels and scores MediaPipe Tasks for Web gives "
            "(two texts and their cosine for a sentence-embedding model). The page, the model and "
            "MediaPipe's wasm files all come from DIR; nothing is fetched from elsewhere. "
            "kbert export writes web/ for text classification, multi-label classification and "
            "sentence embedding, when it writes their MediaPipe file. Stop with Ctrl-C."
        ),
        usage="kbert serve-web DIR [--port PORT]",
    )
    p.add_argument("dir", metavar="DIR", help="an export folder with web/ (or its web/ folder)")
    p.add_argument("--port", type=port, default=DEFAULT_PORT, help="the port to listen on; 0: any free one")
    p.set_defaults(run=run_serve_web, check=check_serve_web_args)
    return p


def port(value):
    """`--port`: an integer from 0 to 65535."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r}; expected a port number from 0 to 65535")
    return number


def check_serve_web_args(args):
    from kbert.export.web import served_folder

    served_folder(args.dir)


def run_serve_web(args):
    """Serves until interrupted; returns 0."""
    from kbert.export.web import page_url, serve

    server = serve(args.dir, args.port)
    with server:
        print_json({"url": page_url(server), "folder": args.dir})
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a user stops the server: not a failure
    return 0
