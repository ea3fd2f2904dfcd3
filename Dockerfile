# The shardwise server image: API, migrations and solver worker (one image, three commands in docker-compose.yml).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY shardwise shardwise
COPY wire wire
COPY solver solver
COPY hwprofiles hwprofiles
COPY clients clients
# the executor and the calibration: not run by the server, but the package holds them (the CLI loads the calibrate
# command through its entry point; shardwise/ links to both folders)
COPY runtime runtime
COPY calibrate calibrate
COPY service service
COPY migrations migrations
RUN pip install '.[server]'
RUN useradd --create-home shardwise
USER shardwise
EXPOSE 8000
CMD ["shardwise", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-migrate"]
