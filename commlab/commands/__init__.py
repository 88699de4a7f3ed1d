"""CLI subcommands: each module here defines ``register(subparsers)``; ``cli`` finds them all."""
