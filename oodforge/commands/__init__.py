"""The user commands, one module each (`oodforge <name with dashes>`): `build_parser()`, `main(argv) -> int` and
`DOC`, where its inputs are documented. `oodforge.cli` lists and runs them; scripts/<name>.py wraps each."""
