"""Readers for raw inputs, one module per kind. Each turns a source into features plus Arrow rows."""
