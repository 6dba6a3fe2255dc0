"""routeaudit's Streamlit dashboard: thin pages over :mod:`audit.queries`.

Run with ``routeaudit dashboard --db PATH`` (or ``streamlit run dashboards/app.py`` with
``ROUTEAUDIT_DB`` set). Nothing imports this package.
"""
