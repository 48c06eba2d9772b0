"""The run's web dashboard: one page on 127.0.0.1 that reads a log path (never writes it).

    python -m coordinator dashboard --log-path L [--port 8080] [--host 127.0.0.1]
    bash scripts/run.sh ... --dashboard-port 8080      # started and stopped with the run

Modules: `journals` (episodes and their turns from the trajectory journals),
`state` (everything the page shows, as one JSON-able snapshot), `svg` (the
curves, drawn as inline SVG), `page` (the HTML and its small polling script),
`server` (the HTTP server and the subcommand). docs/observability.md
says what the page shows and where each number comes from.
"""
