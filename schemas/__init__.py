"""Every table's schema, declared once."""
