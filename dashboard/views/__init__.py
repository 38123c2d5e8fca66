"""The dashboard's pages. Each is a script that st.navigation runs (as `__main__`); importing one
only defines its functions, so the layering test can import them all."""
