"""Django migrations of the leasebox app: each applies leasebox's own SQL migrations."""
