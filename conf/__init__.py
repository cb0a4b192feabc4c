"""Typed configuration."""
