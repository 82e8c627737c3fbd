"""`manage.py leasebox_migrate`."""
