"""Django management commands of the leasebox app."""
