"""The entry point: `flask --app app ...` and gunicorn's `app:app`."""
from webapp import create_app

app = create_app()
