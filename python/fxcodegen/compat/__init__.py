"""Drop-in surfaces for other projects' codegen modules."""
