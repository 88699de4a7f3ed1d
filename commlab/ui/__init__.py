"""What the pages need, without Streamlit: the form, run lists, live views."""
