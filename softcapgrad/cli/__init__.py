"""The command line: parse, call a lower layer, render. Nothing below this package imports it."""
